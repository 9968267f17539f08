import QueueEngine
import Testing

@testable import QueueAPI

@Suite("Crash counts: one rule for a single instance and a partition's new holder")
struct CrashCountsTests {
    static func op(_ raw: UInt64, _ state: OperationState, queue: String = "q") -> OperationSnapshot {
        let t0 = Timestamp(nanoseconds: 1_795_341_600_000_000_000)
        return OperationSnapshot(
            id: OperationID(raw: raw), queue: queue, name: nil, kind: "delay", spec: .object([("seconds", .number(1))]),
            state: state, outcome: nil, isCancelled: false, queuePriority: .normal, dependencies: [], progress: nil,
            attempt: 0, result: nil, error: nil, createdAt: t0, startedAt: nil, finishedAt: nil, revision: 1, options: OperationOptions())
    }

    struct Case: Sendable, CustomTestStringConvertible {
        let name: String
        let operations: [OperationSnapshot]
        let counts: [String: Int]
        let clearOthers: Bool
        /// Queues whose runs the crash cut.
        let crashedQueues: Set<String>
        let writes: [String: String?]
        let poisoned: Set<UInt64>
        var testDescription: String { name }
    }

    static let cases: [Case] = [
        Case(
            name: "an executing run cut by a crash counts one more; the third fails it", operations: [op(1, .executing), op(2, .executing)],
            counts: ["crashes:op-0000000000000001": 2], clearOthers: true, crashedQueues: ["q"],
            writes: ["crashes:op-0000000000000001": "3", "crashes:op-0000000000000002": "1"], poisoned: [1]),
        Case(
            name: "not executing, or not cut: the count starts over", operations: [op(1, .ready), op(2, .executing, queue: "other")],
            counts: ["crashes:op-0000000000000001": 2, "crashes:op-0000000000000002": 1], clearOthers: false, crashedQueues: ["q"],
            writes: ["crashes:op-0000000000000001": nil, "crashes:op-0000000000000002": nil], poisoned: []),
        Case(
            name: "a single instance clears counts of operations it no longer has; a partition's holder leaves others' alone",
            operations: [op(1, .executing)], counts: ["crashes:op-0000000000000009": 1], clearOthers: true, crashedQueues: ["q"],
            writes: ["crashes:op-0000000000000001": "1", "crashes:op-0000000000000009": nil], poisoned: []),
        Case(
            name: "another partition's count stays", operations: [op(1, .executing)], counts: ["crashes:op-0000000000000009": 1],
            clearOthers: false, crashedQueues: ["q"], writes: ["crashes:op-0000000000000001": "1"], poisoned: []),
        Case(
            name: "damaged counts neither trap nor stick", operations: [op(1, .executing), op(2, .executing)],
            counts: ["crashes:op-0000000000000001": Int.max, "crashes:op-0000000000000002": -7], clearOthers: true, crashedQueues: ["q"],
            writes: ["crashes:op-0000000000000001": "1000", "crashes:op-0000000000000002": "1"], poisoned: [1]),
    ]

    @Test(arguments: cases)
    func counts(_ c: Case) {
        let (writes, poisoned) = CrashCounts.next(operations: c.operations, counts: c.counts, clearOthers: c.clearOthers) { op in
            c.crashedQueues.contains(op.queue)
        }
        #expect(Dictionary(writes.map { ($0.key, $0.value) }, uniquingKeysWith: { _, b in b }) == c.writes)
        #expect(writes.count == c.writes.count, "one write per key")
        #expect(Set(poisoned.map(\.raw)) == c.poisoned)
    }
}
