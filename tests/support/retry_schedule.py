"""retry_schedule.py — the handler's run times and the back-off check that the consumer-retry
tests share (test_consume_retry.sh, test_consume_unordered.sh), written once. Their heredocs
import it (PYTHONPATH=tests/support).

  runs(path)   {message: [run times, s]} from retry_fx.sh's $T/runs ("TIME MESSAGE" lines)
  spaced(t, o, n, base, open_first)
               message o ran n times and try i+1 came base * 2**(i-1) s after try i, within the
               jitter (x0.8 - 0.1 s .. x1.2 + 0.5 s); with open_first the second try (the first
               across a restart) has no upper bound, never early. Prints each gap; raises
               AssertionError naming the first that is off.
"""


def runs(path):
    t = {}
    for line in open(path):
        ts, o = line.split()
        t.setdefault(o, []).append(float(ts))
    return t


def spaced(t, o, n, base, open_first):
    ts = t.get(o, [])
    assert len(ts) == n, "%s ran %d times, want %d: %s" % (o, len(ts), n, ts)
    for i in range(1, n):
        gap, step = ts[i] - ts[i - 1], base * 2 ** (i - 1)
        # the try after the restart: may be late by the restart (a new Kafka group member waits
        # for its assignment for seconds), never early
        late = 1e9 if (open_first and i == 1) else 1.2 * step + 0.5
        # the inbox's failure time is taken before the handler starts, the handler's timestamp
        # after its process started: 0.1 s of slack below
        ok = 0.8 * step - 0.1 <= gap <= late
        print("%s try %d: %.3f s after the previous (back-off %.1f s +-20%%)%s"
              % (o, i + 1, gap, step, "" if ok else "  <-- outside"))
        assert ok, "%s: try %d came %.3f s after the previous, back-off %.1f s" % (o, i + 1, gap, step)
