"""python -m shortconv.build_native [-v] [--status]: compile the native module of the
package's common calls against the installed torch (shortconv/native.py), or say whether
it is used.  Prints the module's path; exits non-zero when the build fails."""

import sys

from . import native


def main(argv):
    if "--status" in argv:
        print(native.status())
        return 0
    if any(a not in ("-v",) for a in argv):
        print("usage: python -m shortconv.build_native [-v] [--status]", file=sys.stderr)
        return 2
    print(native.build(verbose="-v" in argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
