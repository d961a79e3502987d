"""``python -m rlbook.checkpoints build|verify [NAME ...]``: rebuild the shipped base policies, or check them."""

import argparse
import sys
import tempfile
from pathlib import Path

from rlbook.checkpoints import RECIPES, build_checkpoint, checkpoint_dir, file_hashes, load_manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlbook.checkpoints", description=__doc__)
    parser.add_argument("command", choices=["build", "verify"],
                        help="build: train and overwrite the shipped files; verify: train into a temporary "
                             "folder and compare every file's sha256 with the shipped one")
    parser.add_argument("names", nargs="*", default=sorted(RECIPES), help=f"default: all of {sorted(RECIPES)}")
    args = parser.parse_args(argv)
    failures = 0
    for name in args.names:
        if args.command == "build":
            manifest = build_checkpoint(name, checkpoint_dir(name))
            print(f"{name}: {manifest['sft_steps']} SFT steps, sampled accuracy "
                  f"{manifest['final_sampled_accuracy']:.3f}, written to {checkpoint_dir(name)}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            build_checkpoint(name, Path(tmp))
            rebuilt, shipped = file_hashes(tmp), load_manifest(name)["sha256"]
            same = rebuilt == shipped == file_hashes(checkpoint_dir(name))
            failures += not same
            print(f"{name}: {'identical' if same else 'DIFFERENT'} "
                  f"({', '.join(f for f in rebuilt if rebuilt[f] != shipped.get(f)) or 'all files match'})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
