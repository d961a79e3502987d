"""``python -m rlbook.checkpoints build|verify [NAME ...]``: rebuild the shipped base policies, or check them.

build   retrain each base policy from its recipe (SFT on the task's "train" split until the sampled accuracy on
        "test" problems reaches the target at `stop_patience` evaluations in a row) and overwrite its files and
        manifest (which records the first SFT losses, the targets, the accuracy and the file hashes).
verify  check the shipped files (sha256 as in the manifest; the recorded accuracy, re-measured), then retrain in
        memory and check what holds on any CPU: the first SFT losses equal the manifest's to a relative
        tolerance, the run reaches its target, and its final accuracy lies in the recipe's band. It does not
        compare the rebuilt bytes: other CPUs round differently, so training stops elsewhere with other weights.
"""

import argparse
import sys

from rlbook.checkpoints import RECIPES, build_checkpoint, check_rebuild, check_shipped, checkpoint_dir


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlbook.checkpoints", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["build", "verify"], help="see above")
    parser.add_argument("names", nargs="*", default=sorted(RECIPES), help=f"default: all of {sorted(RECIPES)}")
    args = parser.parse_args(argv)
    for name in args.names:
        if name not in RECIPES:
            parser.error(f"unknown base policy {name!r}; choose from {sorted(RECIPES)}")
    failures = 0
    for name in args.names:
        if args.command == "build":
            manifest = build_checkpoint(name, checkpoint_dir(name))
            low, high = manifest["targets"]["accuracy_band"]
            ok = manifest["reached_target"] and low <= manifest["final_sampled_accuracy"] <= high
            failures += not ok
            print(f"{name}: {manifest['sft_steps']} SFT steps (target reached: {manifest['reached_target']}), "
                  f"sampled accuracy {manifest['final_sampled_accuracy']:.3f} (band [{low}, {high}]), "
                  f"written to {checkpoint_dir(name)}" + ("" if ok else ": FAILED"))
            continue
        problems = check_shipped(name)
        rebuild_problems, measured = check_rebuild(name)
        problems += rebuild_problems
        failures += bool(problems)
        print(f"{name}: rebuilt in {measured['sft_steps']} SFT steps, sampled accuracy "
              f"{measured['final_sampled_accuracy']:.3f}: " + ("; ".join(problems) if problems else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
