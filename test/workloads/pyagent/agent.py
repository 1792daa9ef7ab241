#!/usr/bin/env python3
"""pyagent: a CPython asyncio "agent" whose state is many small objects.

The state is a dict of --entries small dicts, built at start from a
deterministic seed:

    {"id": i, "name": "item<i>", "score": <float>, "tags": ["t<n>", "t<m>"]}

(seven objects per entry: the dict, its int, str, float, list and two
tag strings). Every tick the agent iterates over all of them to compute a
checksum. Reading an object in CPython writes its reference count, so each
tick writes to most pages of the state (61% of them at the default size,
spread over nearly every 2 MiB of it: bench/pywrites): after a restore from
a shared base, the agent un-shares most of its heap within one tick. That is the point of
this workload (DESIGN.md 4.5); the Go tick workload only reads.

Output: one line once the state is built, then one line per tick, in the
tick workload's format (internal/sandbox.ParseTick):

    pyagent entries=N seed=S build_s=SECONDS python=VERSION
    tick=N mib=M sum=ok|BAD mark=HEX pass_ms=MS

The tick line is printed after the pass it reports, so the first line after
a restore comes after the restored process has touched every object;
pass_ms is how long that pass took, by the guest's monotonic clock (the
first pass after a restore is where a runtime's copy-on-write or page
loading shows in the workload's own time). N
counts from 0 and continues across checkpoint and restore; M is the resident
memory of the process in MiB (/proc/self/statm); sum=ok iff the pass's
checksum equals the one computed when the state was built; mark is 0 until
marked.

Commands: every tick, if the file --ctl (default /tmp/ctl) exists, its
content is run as a command and the file is removed. `agent.py --send CMD`
writes CMD there atomically (for `runsc exec`).

    mark  store a fresh random value (os.urandom) in the state; every later
          line prints it as mark=HEX
    fork  fork(); the child runs a full checksum pass and prints
          "forkchild sum=ok|BAD mark=HEX", then exits
    hold  fork() a child that keeps the state, shared with this process,
          and runs the commands of --ctl-child (default --ctl plus
          ".child") one at a time; it prints "holder ready" first. This
          process then reads only the first LIGHT_ENTRIES entries every
          tick (its tick lines check those), so that the two keep
          sharing the rest until the child writes it; once the child has
          exited, it prints "holder exited status=N" and its ticks read
          every entry again. The child's commands:
            pass P  read (and so write) the first P% of the entries once;
                    prints "holder pass=P ms=MS"
            check   a full checksum pass; prints "holder sum=ok|BAD mark=HEX"
            exit    exit
    dump  also write the next tick line to --dump (default /tmp/dump)
"""

import argparse
import asyncio
import itertools
import os
import random
import sys
import time
import traceback

MASK = (1 << 64) - 1

# LIGHT_ENTRIES is how many entries a tick reads once a holder child keeps
# the state (the "hold" command).
LIGHT_ENTRIES = 1000


class State:
    """The agent's state: the entries and the mark."""

    def __init__(self, entries, seed):
        rng = random.Random(seed)
        items = {}
        for i in range(entries):
            items[i] = {
                "id": i,
                "name": f"item{i}",
                "score": rng.random() * 100.0,
                "tags": [f"t{rng.randrange(64)}", f"t{rng.randrange(64)}"],
            }
        self.items = items
        self.mark = 0
        self.expected = self.checksum()
        self.expected_light = self.checksum(LIGHT_ENTRIES)

    def checksum(self, limit=None):
        """Reads every object of the first limit entries (all if None);
        returns a 64-bit checksum."""
        s = 0
        for v in itertools.islice(self.items.values(), limit):
            tags = v["tags"]
            s = (s * 1000003 + v["id"] + len(v["name"]) + int(v["score"] * 1e6)
                 + len(tags[0]) + len(tags[1])) & MASK
        return s


def parse_interval(s):
    """Parses "100ms", "0.1s" or "0.1" (seconds) into seconds."""
    if s.endswith("ms"):
        return float(s[:-2]) / 1000.0
    if s.endswith("s"):
        return float(s[:-1])
    return float(s)


def rss_mib():
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") >> 20
    except (OSError, ValueError, IndexError):
        return 0


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(data)
    os.rename(tmp, path)


def fork_and_check(state):
    pid = os.fork()
    if pid == 0:
        try:
            ok = state.checksum() == state.expected
            line = "forkchild sum=%s mark=%x\n" % ("ok" if ok else "BAD", state.mark)
            os.write(1, line.encode())
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def take_command(ctl):
    """Returns the command in the file ctl, or None if there is none. The
    file is taken by renaming it, so that a command sent while this one is
    read is not removed with it."""
    try:
        os.rename(ctl, ctl + ".taken")
        with open(ctl + ".taken") as f:
            cmd = f.read().strip()
        os.remove(ctl + ".taken")
    except FileNotFoundError:
        return None
    return cmd


def hold(state, ctl):
    """Forks the holder child (the "hold" command); returns its pid in the
    parent. The child never returns."""
    pid = os.fork()
    if pid != 0:
        return pid
    status = 0
    try:
        out("holder ready")
        while True:
            cmd = take_command(ctl)
            if cmd is None:
                time.sleep(0.05)
                continue
            cmd = cmd.split()
            if cmd[:1] == ["pass"] and len(cmd) == 2 and cmd[1].isdigit():
                start = time.monotonic()
                state.checksum(len(state.items) * int(cmd[1]) // 100)
                out("holder pass=%s ms=%.1f" % (cmd[1], (time.monotonic() - start) * 1000.0))
            elif cmd == ["check"]:
                ok = state.checksum() == state.expected
                out("holder sum=%s mark=%x" % ("ok" if ok else "BAD", state.mark))
            elif cmd == ["exit"]:
                break
            else:
                out("holder: unknown command %r" % " ".join(cmd))
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def out(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def run(state, args, interval):
    dump = False
    tick = 0
    holder = 0
    while True:
        if holder:
            try:
                pid, status = os.waitpid(holder, os.WNOHANG)
            except ChildProcessError:
                pid, status = holder, -1
            if pid == holder:
                out("holder exited status=%d" % (os.waitstatus_to_exitcode(status) if status >= 0 else -1))
                holder = 0
        cmd = take_command(args.ctl)
        if cmd == "mark":
            state.mark = int.from_bytes(os.urandom(8), "big")
        elif cmd == "fork":
            fork_and_check(state)
        elif cmd == "hold":
            if holder:
                out("already holding")
            else:
                holder = hold(state, args.ctl_child or args.ctl + ".child")
        elif cmd == "dump":
            dump = True
        elif cmd is not None:
            out("unknown command %r" % cmd)

        pass_start = time.monotonic()
        if holder:
            ok = state.checksum(LIGHT_ENTRIES) == state.expected_light
        else:
            ok = state.checksum() == state.expected
        pass_ms = (time.monotonic() - pass_start) * 1000.0
        line = "tick=%d mib=%d sum=%s mark=%x pass_ms=%.1f" % (tick, rss_mib(), "ok" if ok else "BAD", state.mark, pass_ms)
        out(line)
        if dump:
            dump = False
            try:
                write_atomic(args.dump, line + "\n")
            except OSError as e:
                out("dump failed: %s" % e)
        tick += 1
        await asyncio.sleep(interval)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--entries", type=int, default=200000, help="number of entries in the state")
    p.add_argument("--interval", default="100ms", help='tick interval: "100ms", "0.1s" or seconds')
    p.add_argument("--seed", type=int, default=1, help="seed of the state's content")
    p.add_argument("--ctl", default="/tmp/ctl", help="command file")
    p.add_argument("--ctl-child", default="", help="command file of the hold command's child (default: --ctl plus .child)")
    p.add_argument("--dump", default="/tmp/dump", help="file the dump command writes")
    p.add_argument("--send", default="", help="write this command to the command file and exit")
    args = p.parse_args()

    if args.send:
        write_atomic(args.ctl, args.send)
        return
    interval = parse_interval(args.interval)
    start = time.monotonic()
    state = State(args.entries, args.seed)
    out("pyagent entries=%d seed=%d build_s=%.3f python=%s" % (
        args.entries, args.seed, time.monotonic() - start, sys.version.split()[0]))
    asyncio.run(run(state, args, interval))


if __name__ == "__main__":
    main()
