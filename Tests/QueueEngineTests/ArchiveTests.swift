import Foundation
import Locking
import QueueEngine
import Testing

extension Engine {
    @Suite("restoreArchive: a queue and its operations in one step")
    struct ArchiveTests {
        static func manual(_ deps: [BatchDependency] = [], name: String? = nil, paused: Bool = false, attempt: Int = 0) -> ArchiveElement {
            ArchiveElement(request: OperationRequest(kind: "manual", name: name), dependencies: deps, isPaused: paused, attempt: attempt)
        }

        @Test("the queue, the operations, the pauses and the attempts go to the store in one append, so in one commit")
        func oneAppend() throws {
            let store = AppendLogStore()
            let engine = QueueEngine(kinds: ["manual": ManualKind()], store: store, clock: ManualClock(), scheduler: ManualClock())
            let before = store.appends.count
            let made = try engine.restoreArchive(
                into: "q", maxConcurrentOperationCount: 1, isSuspended: false,
                [Self.manual(name: "a"), Self.manual([.element(0)], name: "b", paused: true), Self.manual(name: "c", attempt: 2)])
            #expect(made.operations.map(\.name) == ["a", "b", "c"])
            let appends = store.appends.dropFirst(before)
            #expect(appends.count == 1)
            let records = appends.first ?? []
            #expect(records.contains { if case let .queue(q) = $0 { return q.name == "q" } else { return false } })
            let ops = Set(records.compactMap { r -> OperationID? in if case let .operation(s) = r { return s.id } else { return nil } })
            #expect(ops == Set(made.operations.map(\.id)))
            // Nothing started before the pause: a started `b` could not be paused as never-started.
            #expect(made.operations[1].state == .paused)
            #expect(made.operations[1].startedAt == nil)
            #expect(made.operations[2].attempt == 2)
        }

        @Test("a later element named as a dependency is added first; the rest keep the archive's order")
        func dependenciesFirst() throws {
            let f = Fixture()
            let made = try f.engine.restoreArchive(
                into: "q", maxConcurrentOperationCount: -1, isSuspended: true,
                [Self.manual(name: "a"), Self.manual([.element(3)], name: "b"), Self.manual(name: "c"), Self.manual(name: "d")])
            // In the archive's order in the answer; by id (creation), d comes before b.
            #expect(made.operations.map(\.name) == ["a", "b", "c", "d"])
            let byID = made.operations.sorted { $0.id < $1.id }.compactMap(\.name)
            #expect(byID == ["a", "d", "b", "c"])
            #expect(made.operations[1].dependencies == [made.operations[3].id])
        }

        @Test("a refusal changes nothing: no queue, no operation, no event, no id used")
        func refusalChangesNothing() throws {
            let f = Fixture()
            let log = EventLog(f.engine)
            _ = try f.queue("busy", suspended: true)
            _ = try f.add("busy")
            let seen = log.all.count
            let cases: [(String, [ArchiveElement])] = [
                ("busy", [Self.manual()]),
                ("fresh", [Self.manual(), Self.manual([.element(1)])]),
                ("fresh", [Self.manual([.element(1)]), Self.manual([.element(0)])]),
                ("fresh", [Self.manual(), ArchiveElement(request: OperationRequest(kind: "nope"), dependencies: [])]),
                ("fresh", [Self.manual(), ArchiveElement(request: OperationRequest(kind: "barrier"), dependencies: [])]),
                ("bad name!", [Self.manual()]),
            ]
            for (queue, elements) in cases {
                #expect(throws: ArchiveRefusal.self) {
                    try f.engine.restoreArchive(into: queue, maxConcurrentOperationCount: -1, isSuspended: false, elements)
                }
            }
            #expect(f.engine.queues().map(\.name) == ["busy"])
            #expect(log.all.count == seen)
            let next = try f.add("busy")
            #expect(next.raw == 2, "no id was used by a refused restore")
        }

        @Test("export reads unfinished operations only, each with its unfinished dependencies, and none past the limit")
        func export() throws {
            let f = Fixture()
            _ = try f.queue("q", suspended: true)
            let done = try f.add("q")
            let a = try f.add("q", after: [done])
            _ = try f.engine.cancel(done)
            let b = try f.add("q", after: [a, done])
            let archive = try f.engine.archive(queue: "q", limit: 10)
            #expect(archive.operations.map(\.id) == [a, b])
            #expect(archive.operations.map(\.dependencies) == [[], [a]])
            let capped = try f.engine.archive(queue: "q", limit: 1)
            #expect(capped.unfinished == 2 && capped.operations.isEmpty)
            #expect(throws: EngineError.queueNotFound("nope")) { try f.engine.archive(queue: "nope", limit: 10) }
        }
    }
}
