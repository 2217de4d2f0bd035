"""Instructions per call of the Functions library's grant path against the seed script
(callgrind: not affected by machine load, unlike server time).

Starts RL_SERVER (default redis-server) under valgrind's callgrind with the library
(RL_LIBRARY, default functions/rl.lua) and scripts/token_bucket.lua, and for each case runs
300 unmeasured calls, zeroes the counters, runs RL_PROFILE_CALLS (default 3000) pipelined
calls and reads the inclusive cost of the command the server times (`fcallCommand`,
`evalShaCommand`). Cases: full (rl_take at 1e6/s cap 1e6: the bucket is full again between
calls), busy (1000/s cap 1e9: drained slowly), seed (the seed script, 1000/s cap 1e9), and on
request rand / seedrand (20k keys, each created before), deny, seeddeny, lease (20 tokens,
1000 keys, 100 ms), mtake (2 keys), reserve, share (16 holders). FLAT=case prints the
costliest named functions of that case.
Needs valgrind (callgrind_control). Run:
    target/functions-venv/bin/python functions/profile.py [full,busy,seed]
"""

import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from benchtool.callgrind import Callgrind  # noqa: E402

import redis  # noqa: E402

SERVER = os.environ.get("RL_SERVER", "redis-server")
LIBRARY = os.environ.get("RL_LIBRARY", os.path.join(ROOT, "functions", "rl.lua"))
CALLS = int(os.environ.get("RL_PROFILE_CALLS", "3000"))


def main():
    seed = open(os.path.join(ROOT, "scripts", "token_bucket.lua")).read()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = tempfile.mkdtemp(prefix="rl-prof-")
    out = os.path.join(d, "cg.out")
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                             SERVER, "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        for _ in range(600):
            try:
                r.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.2)
        r.function_load(open(LIBRARY).read(), replace=True)
        sha = r.script_load(seed)
        # Each case: the function timed, and the call (a function of the call's index).
        cases = {
            "full": ("fcallCommand", lambda i: ("FCALL", "rl_take", 1, "f:full", "1000000",
                                                "1000000", 1)),
            "busy": ("fcallCommand", lambda i: ("FCALL", "rl_take", 1, "f:busy", "1000",
                                                "1000000000", 1)),
            "rand": ("fcallCommand", lambda i: ("FCALL", "rl_take", 1, f"f:r:{i * 7919 % 20000}",
                                                "1000000", "1000000", 1)),
            "deny": ("fcallCommand", lambda i: ("FCALL", "rl_take", 1, "f:deny", "0.000001", "1",
                                                1)),
            "lease": ("fcallCommand", lambda i: ("FCALL", "rl_lease", 1, f"f:l:{i % 1000}",
                                                 "1000000", "1000000", 20, 100)),
            "mtake": ("fcallCommand", lambda i: ("FCALL", "rl_mtake", 2, "f:m1", "f:m2", 1,
                                                 "1000", "1000000000", "1000", "1000000000")),
            "reserve": ("fcallCommand", lambda i: ("FCALL", "rl_reserve", 1, "f:rv", "1000",
                                                   "1000000000", 1, 0)),
            "share": ("fcallCommand", lambda i: ("FCALL", "rl_share", 1, "f:sh", "1000", "100",
                                                 f"h{i % 16}", 10, 10000)),
            "seed": ("evalShaCommand", lambda i: ("EVALSHA", sha, 1, "s:g", "1000", "1000000000",
                                                  1)),
            "seedrand": ("evalShaCommand", lambda i: ("EVALSHA", sha, 1,
                                                      f"s:r:{i * 7919 % 20000}", "1000000",
                                                      "1000000", 1)),
            "seeddeny": ("evalShaCommand", lambda i: ("EVALSHA", sha, 1, "s:d", "0.000001", "1",
                                                      1)),
        }
        only = sys.argv[1].split(",") if len(sys.argv) > 1 else ["full", "busy", "seed"]
        res = {}
        for name in only:
            root, args = cases[name]
            pipe = r.pipeline(transaction=False)
            # Warm: random keys all created once (their calls then find a stored bucket).
            for i in range(20000 if name in ("rand", "seedrand") else 300):
                pipe.execute_command(*args(i))
                if i % 1000 == 999:
                    pipe.execute()
            pipe.execute()
            subprocess.run(["callgrind_control", "-z", str(proc.pid)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            for j in range(0, CALLS, 500):
                pipe = r.pipeline(transaction=False)
                for i in range(j, j + 500):
                    pipe.execute_command(*args(i + 1000003))
                pipe.execute()
            subprocess.run(["callgrind_control", "-d", str(proc.pid)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            dumps = sorted((f for f in os.listdir(d) if f.startswith("cg.out.")),
                           key=lambda f: int(f.rsplit(".", 1)[1]))
            cg = Callgrind.from_file(os.path.join(d, dumps[-1]))
            res[name] = cg.inclusive(root) / CALLS
            if os.environ.get("FLAT") == name:
                rows = []
                for fn in cg.functions:
                    if not fn.startswith("0x"):
                        rows.append((cg.inclusive(fn) / CALLS, fn))
                for inc, fn in sorted(rows, reverse=True)[:60]:
                    print(f"{inc:10,.0f}  {fn[:90]}")
    finally:
        proc.kill()
        proc.wait()
    version = subprocess.run([SERVER, "--version"], capture_output=True, text=True).stdout.split()
    base = {"full": "seed", "busy": "seed", "rand": "seedrand", "deny": "seeddeny"}
    print(" ".join(version[:3]), " ".join(f"{k}={v:,.0f}" for k, v in res.items()),
          " ".join(f"{k}/{base[k]}={res[k] / res[base[k]]:.3f}" for k in res
                   if base.get(k) in res))


if __name__ == "__main__":
    main()
