import Foundation
import Locking
import QueueEngine
import Testing

/// A store that keeps what each `append` handed it, to see which changes share a commit.
final class AppendLogStore: OperationStore {
    private let log = Locked<[[StoreRecord]]>([])
    var wantsRecords: Bool { true }
    func append(_ records: [StoreRecord], upTo ticket: UInt64) { log.withLock { $0.append(records) } }
    func whenDurable(_ ticket: UInt64, _ done: @escaping @Sendable () -> Void) { done() }
    var appends: [[StoreRecord]] { log.value }
}

extension Engine {
    @Suite("addOperations: atomic batches across queues")
    struct BatchTests {
        static func manual(_ queue: String, _ deps: [BatchDependency] = [], name: String? = nil, priority: QueuePriority = .normal) -> BatchElement {
            BatchElement(queue: queue, request: OperationRequest(kind: "manual", name: name, queuePriority: priority), dependencies: deps)
        }

        @Test("a batch adds its elements in order, across queues, with earlier elements as dependencies")
        func addsInOrder() throws {
            let f = Fixture()
            try f.queue("a", suspended: true)
            try f.queue("b", suspended: true)
            let existing = try f.add("a")
            let made = try f.engine.addOperations([
                Self.manual("a", name: "first"),
                Self.manual("b", [.element(0)], name: "second"),
                Self.manual("a", [.element(0), .element(1), .operation(existing)], name: "third"),
            ])
            #expect(made.map(\.name) == ["first", "second", "third"])
            #expect(made.map(\.queue) == ["a", "b", "a"])
            #expect(made[0].id < made[1].id && made[1].id < made[2].id, "ids in the order of the batch")
            #expect(made[1].dependencies == [made[0].id])
            #expect(made[2].dependencies == [made[0].id, made[1].id, existing])
            #expect(made.map(\.state) == [.ready, .pending, .pending])
            #expect(try f.engine.queue(named: "a").operationCount == 3)
            #expect(try f.engine.queue(named: "b").operationCount == 1)
            // Dependencies hold as for single adds: `second` starts once `first` finished.
            try f.engine.resumeQueue("a")
            try f.engine.resumeQueue("b")
            #expect(!f.kind.wasStarted(made[1].id))
            f.kind.finish(made[0].id)
            #expect(f.kind.wasStarted(made[1].id))
        }

        @Test("the whole batch goes to the store in one append, so in one commit")
        func oneAppend() throws {
            let store = AppendLogStore()
            let engine = QueueEngine(kinds: ["manual": ManualKind()], store: store, clock: ManualClock(), scheduler: ManualClock())
            _ = try engine.createQueue(name: "a", isSuspended: true)
            _ = try engine.createQueue(name: "b", isSuspended: true)
            let before = store.appends.count
            let made = try engine.addOperations((0..<50).map { i in Self.manual(i % 2 == 0 ? "a" : "b", i > 0 ? [.element(i - 1)] : []) })
            #expect(made.count == 50)
            let appends = store.appends.dropFirst(before)
            #expect(appends.count == 1)
            let ops = appends.first?.compactMap { r -> OperationID? in if case let .operation(s) = r { return s.id } else { return nil } } ?? []
            #expect(Set(ops) == Set(made.map(\.id)))
        }

        enum Bad: String, CaseIterable, Sendable { case unknownQueue, unknownKind, unknownDependency, laterRef, barrierKind }

        @Test("one bad element, in any position, adds nothing, emits no event and uses no id", arguments: Bad.allCases, 0..<4)
        func oneBadElementChangesNothing(bad: Bad, position: Int) throws {
            let f = Fixture()
            try f.queue("a", suspended: true)
            try f.queue("b")
            let log = EventLog(f.engine)
            var elements = (0..<4).map { i in Self.manual(i % 2 == 0 ? "a" : "b", i > 0 ? [.element(i - 1)] : []) }
            switch bad {
            case .unknownQueue: elements[position].queue = "nope"
            case .unknownKind: elements[position].request.kind = "nope"
            case .unknownDependency: elements[position].dependencies.append(.operation(OperationID(raw: 999)))
            case .laterRef: elements[position].dependencies.append(.element(position))
            case .barrierKind: elements[position].request.kind = "barrier"
            }
            #expect(throws: BatchRefusal.self) { try f.engine.addOperations(elements) }
            do {
                try f.engine.addOperations(elements)
            } catch {
                #expect(error.index == position)
            }
            #expect(log.all.isEmpty, "no event for a refused batch")
            #expect(try f.engine.queue(named: "a").operationCount == 0)
            #expect(try f.engine.queue(named: "b").operationCount == 0)
            #expect(f.kind.started.isEmpty)
            let next = try f.add("a")
            #expect(next == OperationID(raw: 1), "no id was used by the refused batch")
        }

        @Test("limits are counted for the whole batch: per queue and in total")
        func limitsForTheWholeBatch() throws {
            let f = Fixture(configuration: EngineConfiguration(maxUnfinishedOperations: 6, maxUnfinishedPerQueue: 3))
            try f.queue("a", suspended: true)
            try f.queue("b", suspended: true)
            try f.queue("c", suspended: true)
            _ = try f.add("a")
            // a: 1 + 3 > 3; refused at the element that passes the limit.
            do {
                try f.engine.addOperations([Self.manual("a"), Self.manual("b"), Self.manual("a"), Self.manual("a")])
                Issue.record("a batch past the per-queue limit was accepted")
            } catch {
                #expect(error.index == 3)
                guard case .limitReached = error.error else { Issue.record("not a limit: \(error.error)"); return }
            }
            #expect(try f.engine.queue(named: "a").operationCount == 1 && f.engine.queue(named: "b").operationCount == 0)
            // In total: 1 + 6 > 6.
            do {
                try f.engine.addOperations([Self.manual("b"), Self.manual("b"), Self.manual("c"), Self.manual("c"), Self.manual("a"), Self.manual("a")])
                Issue.record("a batch past the total limit was accepted")
            } catch {
                #expect(error.index == 5)
            }
            #expect(try f.engine.queue(named: "b").operationCount == 0)
            // Exactly up to the limits is fine.
            let made = try f.engine.addOperations([Self.manual("b"), Self.manual("b"), Self.manual("c"), Self.manual("c"), Self.manual("a")])
            #expect(made.count == 5)
        }

        @Test("an element may have at most the dependencies a single add may")
        func dependencyLimit() throws {
            let f = Fixture(configuration: EngineConfiguration(maxDependencies: 2))
            try f.queue("a", suspended: true)
            do {
                try f.engine.addOperations([Self.manual("a"), Self.manual("a"), Self.manual("a"), Self.manual("a", [.element(0), .element(1), .element(2)])])
                Issue.record("accepted")
            } catch {
                #expect(error.index == 3)
                #expect(error.error == .invalidArgument(field: "dependencies", detail: "at most 2 dependencies (--max-dependencies); got 3"))
            }
            #expect(try f.engine.queue(named: "a").operationCount == 0)
        }

        @Test("a batch after a barrier waits for it, as a single add does")
        func barrier() throws {
            let f = Fixture()
            try f.queue("a")
            let first = try f.add("a")
            let barrier = try f.engine.addBarrier(to: "a")
            let made = try f.engine.addOperations([Self.manual("a")])
            #expect(made[0].dependencies == [barrier.id] && made[0].state == .pending)
            f.kind.finish(first)
            #expect(f.kind.wasStarted(made[0].id))
        }

        @Test("Foundation differential: addOperations on a serial queue runs the graph in the same order")
        func foundationOrder() throws {
            // A graph, not a tree: d waits for b and c, which both wait for a; priorities mixed.
            struct Node { let name: String; let deps: [Int]; let priority: QueuePriority }
            let nodes = [
                Node(name: "a", deps: [], priority: .normal), Node(name: "x", deps: [], priority: .low),
                Node(name: "b", deps: [0], priority: .normal), Node(name: "c", deps: [0], priority: .high),
                Node(name: "d", deps: [2, 3], priority: .veryHigh), Node(name: "y", deps: [], priority: .normal),
                Node(name: "e", deps: [1, 4], priority: .normal), Node(name: "z", deps: [], priority: .veryLow),
            ]
            let ran = Locked<[String]>([])
            let queue = OperationQueue()
            queue.maxConcurrentOperationCount = 1
            queue.isSuspended = true
            var ops: [BlockOperation] = []
            for n in nodes {
                let name = n.name
                let op = BlockOperation { ran.withLock { $0.append(name) } }
                op.queuePriority = Self.foundation(n.priority)
                for d in n.deps { op.addDependency(ops[d]) }
                ops.append(op)
            }
            queue.addOperations(ops, waitUntilFinished: false)
            queue.isSuspended = false
            queue.waitUntilAllOperationsAreFinished()

            let f = Fixture()
            try f.queue("q", max: 1, suspended: true)
            let made = try f.engine.addOperations(nodes.map { n in Self.manual("q", n.deps.map { .element($0) }, name: n.name, priority: n.priority) })
            try f.engine.resumeQueue("q")
            var finished = 0
            while finished < f.kind.started.count {
                f.kind.finish(f.kind.started[finished])
                finished += 1
            }
            let names = Dictionary(uniqueKeysWithValues: made.map { ($0.id, $0.name ?? "") })
            #expect(f.kind.started.map { names[$0] ?? "?" } == ran.value)
            #expect(ran.value.count == nodes.count)
        }

        static func foundation(_ p: QueuePriority) -> Foundation.Operation.QueuePriority {
            switch p {
            case .veryLow: return .veryLow
            case .low: return .low
            case .normal: return .normal
            case .high: return .high
            case .veryHigh: return .veryHigh
            }
        }
    }
}
