import QueueEngine

/// The store conformance suite moved to `Tests/StoreTests/StoreConformanceTests.swift`, beside the
/// stores it runs on. What is left here is the one fixture `CrashCountsTests` builds its
/// operations from (it names this type); no tests.
enum StoreConformanceTests {
    static let t0 = Timestamp(nanoseconds: 1_795_341_600_000_000_000)

    static func operation(_ raw: UInt64, queue: String = "q") -> OperationSnapshot {
        OperationSnapshot(
            id: OperationID(raw: raw), queue: queue, name: nil, kind: "delay", spec: .object([("seconds", .number(1))]),
            state: .ready, outcome: nil, isCancelled: false, queuePriority: .normal, dependencies: [], progress: nil,
            attempt: 0, result: nil, error: nil, createdAt: t0, startedAt: nil, finishedAt: nil, revision: 1, options: OperationOptions())
    }
}
