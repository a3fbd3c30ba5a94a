import time, threading
from concurrent.futures import ThreadPoolExecutor
from app.services import sweeper, topics
from tests.conftest import make_broker
from tests.integration.test_transactions import Producer

def test_scale(db_url, clock):
    N = 2000
    b = make_broker(db_url, clock, default_transaction_timeout_ms=1000)
    topics.create_topic(b, "t", 4)
    t0 = time.monotonic()
    def mk(i):
        p = Producer(b, f"tx-{i}")
        p.send("t", i % 4, f"v{i}")
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(mk, range(N)))
    t1 = time.monotonic()
    print("create", t1 - t0)
    clock.advance(1001)
    brokers = [make_broker(db_url, clock, default_transaction_timeout_ms=1000) for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        reps = list(pool.map(lambda x: sweeper.abort_timed_out(x, budget_s=120), brokers))
    t2 = time.monotonic()
    print("abort", reps, t2 - t1)
