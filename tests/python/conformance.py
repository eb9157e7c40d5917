"""Python's official `upstash-redis` (PyPI, pinned in requirements.txt) in its
DEFAULT settings — base64 responses, telemetry headers, read-your-writes, one
retry — drives floodgate-rest. Run by tests/tests/rest_conformance.rs, which
starts Redis and the endpoint, installs the package into a virtualenv under
target/ and passes UPSTASH_REDIS_REST_URL / UPSTASH_REDIS_REST_TOKEN /
FLOODGATE_SCRIPT (the token-bucket Lua source file). Prints one line per case
and "pass N" / "fail N" at the end; exits non-zero when a case failed."""

import hashlib
import os
import random
import string
import sys
import traceback

from upstash_redis import Redis
from upstash_redis.errors import UpstashError

redis = Redis.from_env()  # the defaults, as users create it
tag = "".join(random.choices(string.ascii_lowercase, k=8))


def key(name):
    return f"py:{name}:{os.getpid()}:{tag}"


def raises(fn, needle):
    try:
        fn()
    except UpstashError as e:
        assert needle in str(e), f"{needle!r} not in {e}"
        return
    raise AssertionError(f"expected an error with {needle!r}")


def case_strings_numbers_and_missing_keys():
    k = key("kv")
    assert redis.set(k, "bar") is True
    assert redis.get(k) == "bar"
    redis.set(k, "héllo ✓ 🚦")
    assert redis.get(k) == "héllo ✓ 🚦"
    assert redis.get(key("missing")) is None
    assert redis.incrby(key("n"), 5) == 5
    assert redis.ping() == "PONG"
    t = key("ttl")
    redis.set(t, "v", ex=100)
    assert 0 < redis.ttl(t) <= 100


def case_numbers_keep_their_exact_text():
    # Python sends floats by repr and ints whole: Redis must see that text
    f = key("float")
    redis.set(f, 1e-07)
    assert redis.get(f) == "1e-07", redis.get(f)
    big = key("big")
    redis.set(big, 18446744073709551616)
    assert redis.get(big) == "18446744073709551616", redis.get(big)
    z = key("z")
    redis.zadd(z, {"m": 123456789.12345679})
    assert redis.zscore(z, "m") == 123456789.12345679, redis.zscore(z, "m")


def case_pipeline_and_transaction():
    k = key("pipe")
    p = redis.pipeline()
    p.set(k, "1")
    p.incr(k)
    p.get(k)
    assert p.exec() == [True, 2, "2"]
    tx = redis.multi()
    t = key("tx")
    tx.set(t, "10")
    tx.incrby(t, 5)
    tx.get(t)
    assert tx.exec() == [True, 15, "15"]
    bad = redis.pipeline()
    bad.set(k, "x")
    bad.lpush(k, "y")
    raises(bad.exec, "WRONGTYPE")


def case_scripts_fall_back_from_evalsha_to_eval():
    source = open(os.environ["FLOODGATE_SCRIPT"], encoding="utf-8").read()
    sha = hashlib.sha1(source.encode()).hexdigest()
    redis.script_flush()
    raises(lambda: redis.evalsha(sha, keys=[f"fg:{{py:{tag}}}:b"], args=["", "3000000", "1000000"]), "NOSCRIPT")
    k = f"fg:{{py:{tag}}}:b"
    results = [redis.eval(source, keys=[k], args=["", "3000000", "1000000"]) for _ in range(4)]
    assert [r[0] for r in results] == [1, 1, 1, 0], results
    assert redis.script_exists(sha) == [1]
    assert redis.evalsha(sha, keys=[k], args=["", "3000000", "1000000"])[0] == 0


def case_errors_and_tokens():
    k = key("err")
    redis.set(k, "v")
    raises(lambda: redis.lpush(k, "x"), "WRONGTYPE Operation against a key holding the wrong kind of value")
    intruder = Redis(os.environ["UPSTASH_REDIS_REST_URL"], "wrong-token", rest_retries=0)
    try:
        intruder.get(k)
    except Exception as e:  # a 401 is not a Redis reply: the SDK cannot parse it as one
        assert "Unauthorized" in str(e) or "401" in str(e) or isinstance(e, (KeyError, UpstashError)), e
    else:
        raise AssertionError("a wrong token was accepted")
    # administrative commands are refused, with a message saying so
    raises(lambda: redis.execute(["CONFIG", "SET", "requirepass", "x"]), "not allowed")
    raises(lambda: redis.flushall(), "not allowed")


CASES = [v for n, v in sorted(globals().items()) if n.startswith("case_")]

passed = failed = 0
for case in CASES:
    try:
        case()
        passed += 1
        print(f"ok   {case.__name__}")
    except Exception:
        failed += 1
        print(f"FAIL {case.__name__}")
        traceback.print_exc()
print(f"pass {passed}")
print(f"fail {failed}")
sys.exit(1 if failed else 0)
