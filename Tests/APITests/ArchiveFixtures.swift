/// Archives written by hand to the `opqd-archive/1` format as it was released (issue 12).
///
/// Never edit these to make a test pass: they stand for archives operators made and keep.
/// A change that cannot restore them breaks old archives; such a change needs a new format
/// name (`opqd-archive/2`) and must keep reading this one.
enum ArchiveFixtures {
    /// Every field of the format: queue settings; a delay with every option; an element that
    /// depends on a later element and on an operation outside the archive that no server has;
    /// a paused one; one at its third attempt; a barrier and one added after it; one with a
    /// `notBefore` in the past. Ids are the exporting server's; only the map back to them matters.
    static let goldenV1 = #"""
        {
          "format": "opqd-archive/1",
          "exportedAt": "2026-11-24T08:00:00.000Z",
          "queue": {"name": "nightly", "maxConcurrentOperationCount": 1, "isSuspended": true},
          "operations": [
            {"id": "op-0000000000000010", "name": "fetch", "kind": "delay", "spec": {"seconds": 0.01},
             "queuePriority": "high", "dependencies": ["op-0000000000000013"], "isPaused": false, "attempt": 0,
             "timeout": 30, "retry": {"maxAttempts": 4, "backoff": 0.5, "multiplier": 3},
             "notBefore": "2031-01-02T03:04:05.000Z", "createdAt": "2026-11-24T07:59:00.000Z"},
            {"id": "op-0000000000000011", "name": "parse", "kind": "delay", "spec": {"seconds": 0.01},
             "queuePriority": "veryLow", "dependencies": ["op-0000000000000010", "op-00000000deadbeef"],
             "isPaused": true, "attempt": 0, "createdAt": "2026-11-24T07:59:01.000Z"},
            {"id": "op-0000000000000012", "name": "retrying", "kind": "delay", "spec": {"seconds": 0.01},
             "queuePriority": "veryHigh", "dependencies": [], "isPaused": false, "attempt": 3,
             "retry": {"maxAttempts": 5, "backoff": 1, "multiplier": 2}, "createdAt": "2026-11-24T07:59:02.000Z"},
            {"id": "op-0000000000000013", "name": "late", "kind": "delay", "spec": {"seconds": 0.01},
             "queuePriority": "normal", "dependencies": [], "isPaused": false, "attempt": 0,
             "notBefore": "2020-01-01T00:00:00Z", "createdAt": "2026-11-24T07:59:03.000Z"},
            {"id": "op-0000000000000014", "name": "fence", "kind": "barrier", "queuePriority": "normal",
             "dependencies": ["op-0000000000000010", "op-0000000000000011", "op-0000000000000012", "op-0000000000000013"],
             "isPaused": false, "attempt": 0, "createdAt": "2026-11-24T07:59:04.000Z"},
            {"id": "op-0000000000000015", "name": "after-fence", "kind": "external", "spec": {"lease": 30},
             "queuePriority": "low", "dependencies": ["op-0000000000000014"], "isPaused": false, "attempt": 0,
             "retry": {"maxAttempts": 3, "backoff": 1, "multiplier": 2}, "createdAt": "2026-11-24T07:59:05.000Z"}
          ]
        }
        """#
}
