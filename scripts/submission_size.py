"""How big a session's submission is, against the landing limits, before the session stops.

    .venv/bin/python scripts/submission_size.py              # the commits since the session's first HEAD
    .venv/bin/python scripts/submission_size.py --base REV   # the commits in REV..HEAD

A submission lands only if the diffs of all its commits, added up, stay within 256 MiB, and its commits pack to at
most 512 MiB (a file added in one commit and removed in a later one counts twice). Session 40 lost all its work to
that limit with the training stash (~101 MB, docs/training.md, "Stage 4"). This script adds up, commit by commit,
the size of every blob a commit removes or adds (a changed file counts as both its old and its new version): an
upper bound on the diff text of binary files and a generous one for text files. It packs the commits as git sends
them. It exits 1 when either figure is over its limit.

The default base is the oldest entry of HEAD's reflog, which on a fresh checkout is the commit the session started
from (the last landed one).
"""
from __future__ import annotations

import argparse
import subprocess
import sys

MIB = 1024 * 1024


def git(*args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["git", *args], check=True, capture_output=True, input=stdin).stdout


def session_base() -> str:
    """The oldest commit HEAD's reflog knows: where this checkout started."""
    lines = git("reflog", "show", "--format=%H", "HEAD").decode().split()
    if not lines:
        raise SystemExit("submission_size.py: HEAD has no reflog: expected --base REV")
    return lines[-1]


def blob_sizes(shas: set[str]) -> dict[str, int]:
    """Sizes of the given blobs, in one `git cat-file --batch-check`."""
    if not shas:
        return {}
    out = git("cat-file", "--batch-check=%(objectname) %(objectsize)", stdin="\n".join(sorted(shas)).encode())
    return {sha: int(size) for sha, size in (line.split() for line in out.decode().splitlines())}


def commit_diff_bytes(commit: str) -> int:
    """Bytes of every blob the commit removes or adds against its first parent (the root commit: adds only)."""
    raw = git("diff-tree", "-r", "--no-renames", "--raw", "--no-abbrev", "--root", commit).decode()
    # ":old_mode new_mode old_sha new_sha status\tpath"; an all-zero sha is the side that does not exist
    blobs = [sha for line in raw.splitlines() if line.startswith(":") for sha in line.split()[2:4]
             if set(sha) != {"0"}]
    sizes = blob_sizes(set(blobs))
    return sum(sizes[sha] for sha in blobs)


def packed_bytes(base: str) -> int:
    """The commits in base..HEAD packed as git sends them."""
    revs = f"HEAD\n^{base}\n".encode()
    return len(git("pack-objects", "--revs", "--stdout", "--thin", "-q", stdin=revs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default=None, help="the last landed commit (default: the oldest entry of HEAD's reflog)")
    p.add_argument("--diff-limit-mib", type=float, default=256, help="limit on the diffs added up (default 256)")
    p.add_argument("--pack-limit-mib", type=float, default=512, help="limit on the packed commits (default 512)")
    args = p.parse_args(argv)
    base = args.base or session_base()
    commits = git("rev-list", "--reverse", f"{base}..HEAD").decode().split()
    total = 0
    for commit in commits:
        size = commit_diff_bytes(commit)
        total += size
        subject = git("log", "-1", "--format=%s", commit).decode().strip()[:70]
        print(f"{commit[:9]} {size / MIB:9.1f} MiB  {subject}")
    packed = packed_bytes(base) if commits else 0
    print(f"{len(commits)} commits since {base[:9]}: diffs <= {total / MIB:.1f} MiB of {args.diff_limit_mib:g}, "
          f"packed {packed / MIB:.1f} MiB of {args.pack_limit_mib:g}")
    over = total > args.diff_limit_mib * MIB or packed > args.pack_limit_mib * MIB
    if over:
        print("submission_size.py: over a landing limit: squash or drop the commits that replace large files",
              file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
