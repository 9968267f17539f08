#!/usr/bin/env python3
"""An independent oracle for API.md's daylight-saving rule: Python's zoneinfo (the system tz
database) and a cron matcher of its own, walking minute by minute instead of computing.

Input (stdin): JSON [{"cron": "30 2 * * *", "zone": "America/New_York", "from": <unix s>, "count": N}].
Output: JSON [[[utc, note-or-null], ...], ...], one list per case.

The rule: a matching wall time that does not exist runs at the first instant after the gap
("gap"); one that occurs twice runs at its first occurrence only ("repeated"), unless the hour
field is `*` or a step, when it runs at both. Two wall times on one instant are one run.
"""
import json
import sys
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo


def field(text, lo, hi):
    out = set()
    for part in text.split(","):
        step = 1
        if "/" in part:
            part, s = part.split("/")
            step = int(s)
        if part == "*":
            a, b = lo, hi
        elif "-" in part:
            a, b = (int(x) for x in part.split("-"))
        else:
            a = int(part)
            b = hi if step > 1 else a
        out.update(range(a, b + 1, step))
    return out


def matcher(cron):
    f = cron.split()
    minute, hour, dom, month, dow = f
    mins, hours, doms, months, dows = field(minute, 0, 59), field(hour, 0, 23), field(dom, 1, 31), field(month, 1, 12), field(dow, 0, 7)
    if 7 in dows:
        dows.add(0)
    dom_r, dow_r = not dom.startswith("*"), not dow.startswith("*")

    def matches(n):
        if n.minute not in mins or n.hour not in hours or n.month not in months:
            return False
        d_ok, w_ok = n.day in doms, (n.isoweekday() % 7) in dows
        return (d_ok or w_ok) if (dom_r and dow_r) else (d_ok and w_ok)

    return matches, hour.startswith("*")


def case(c):
    z = ZoneInfo(c["zone"])
    matches, elapsed = matcher(c["cron"])
    start = datetime.fromtimestamp(c["from"], timezone.utc)
    runs = {}
    # Every UTC minute for 4 days: wall times that exist.
    u = start.replace(second=0) + timedelta(minutes=1)
    end = start + timedelta(days=4)
    while u < end:
        loc = u.astimezone(z)
        naive = loc.replace(tzinfo=None)
        if matches(naive):
            a, b = naive.replace(tzinfo=z, fold=0), naive.replace(tzinfo=z, fold=1)
            ambiguous = a.utcoffset() != b.utcoffset()
            if not (ambiguous and loc.fold == 1 and not elapsed):
                t = int(u.timestamp())
                runs.setdefault(t, "repeated" if ambiguous else None)
        u += timedelta(minutes=1)
    # Every wall minute: the ones that do not exist run when the gap ends.
    n = start.astimezone(z).replace(tzinfo=None, second=0) - timedelta(hours=3)
    while n < end.astimezone(z).replace(tzinfo=None):
        if matches(n):
            back = n.replace(tzinfo=z).astimezone(timezone.utc).astimezone(z).replace(tzinfo=None)
            if back != n:
                # The first UTC minute whose wall time is past n.
                u = n.replace(tzinfo=z, fold=0).astimezone(timezone.utc) - timedelta(hours=3)
                while u.astimezone(z).replace(tzinfo=None) <= n:
                    u += timedelta(minutes=1)
                t = int(u.timestamp())
                if t > c["from"]:
                    runs.setdefault(t, "gap")
        n += timedelta(minutes=1)
    return [[t, runs[t]] for t in sorted(runs)][: c["count"]]


print(json.dumps([case(c) for c in json.load(sys.stdin)]))
