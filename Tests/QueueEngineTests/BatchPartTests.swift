import QueueEngine
import Testing

extension Engine {
    /// The two steps of a batch across cluster instances at one owner (`QueueEngine+BatchParts`).
    @Suite("Batch parts: set aside, then added or let go")
    struct BatchPartTests {
        static func manual(_ queue: String, _ deps: [BatchDependency] = [], name: String? = nil) -> BatchElement {
            BatchElement(queue: queue, request: OperationRequest(kind: "manual", name: name), dependencies: deps)
        }

        @Test("a prepared part adds nothing; applied later, it takes the ids set aside, in id order within its queue")
        func preparedThenApplied() throws {
            let f = Fixture()
            _ = try f.queue("a", suspended: true)
            _ = try f.queue("b", suspended: true)
            // Elements 0 and 2 are this engine's; element 1 is another instance's part.
            let elements = [Self.manual("a", name: "x"), Self.manual("elsewhere", [.element(0)]), Self.manual("a", [.element(1), .element(0)], name: "z")]
            let ids = try f.engine.prepareBatchPart("t1", elements, mine: [0, 2])
            #expect(ids.count == 2 && ids[0] < ids[1])
            #expect(try f.engine.queue(named: "a").operationCount == 0)
            #expect(f.engine.holdsBatchPart("t1"))
            // A create after the prepare gets a later id, and is listed after the part's.
            let later = try f.add("a")
            #expect(later > ids[1])
            // A queue of a held part cannot be deleted.
            #expect(throws: EngineError.self) { try f.engine.deleteQueue("a", force: true) }
            let sibling = OperationID(raw: 999_999)
            let applied = try f.engine.applyBatchPart("t1", elements, parts: [(7, [0, 2])], ids: [ids[0], sibling, ids[1]])
            #expect(applied.notHere.isEmpty)
            let made = [0, 2].compactMap { applied.statuses[$0] }
            #expect(made.map(\.id) == ids)
            #expect(made.map(\.name) == ["x", "z"])
            #expect(made[1].dependencies == [sibling, ids[0]])
            #expect(made[1].state == .pending, "waits for the other instance's element")
            #expect(!f.engine.holdsBatchPart("t1"))
            let listed = try f.engine.operations(in: "a").operations.map(\.id)
            #expect(listed == [ids[0], ids[1], later], "the queue's list stays in id order")
            // Applied again (a repeat, a takeover): nothing more.
            let again = try f.engine.applyBatchPart("t1", elements, parts: [(7, [0, 2])], ids: [ids[0], sibling, ids[1]])
            #expect([0, 2].compactMap { again.statuses[$0]?.id } == ids)
            #expect(try f.engine.queue(named: "a").operationCount == 3)
            // The other element's end releases z once x is done too.
            f.engine.remoteOperationsFinished([sibling])
            try f.engine.resumeQueue("a")
            f.kind.finish(ids[0])
            #expect(f.kind.wasStarted(ids[1]))
        }

        @Test("a part let go adds nothing, gives its ids back (when known uncommitted and none were given out since), and frees its queues")
        func letGo() throws {
            let f = Fixture()
            _ = try f.queue("a", suspended: true)
            let ids = try f.engine.prepareBatchPart("t2", [Self.manual("a"), Self.manual("a")], mine: [0, 1])
            #expect(f.engine.releaseBatchPart("t2", giveIDsBack: true))
            #expect(!f.engine.releaseBatchPart("t2"), "once")
            #expect(try f.engine.queue(named: "a").operationCount == 0)
            #expect(try f.add("a") == ids[0], "the ids set aside are used again")
            try f.engine.deleteQueue("a", force: true)
        }

        @Test("a prepare is refused like a batch, naming the element by its index in the whole batch, and holds nothing")
        func refusals() throws {
            let f = Fixture()
            _ = try f.queue("a")
            let elements = [Self.manual("a"), Self.manual("elsewhere"), Self.manual("nope")]
            do {
                _ = try f.engine.prepareBatchPart("t3", elements, mine: [0, 2])
                Issue.record("a part with an unknown queue was prepared")
            } catch {
                #expect(error.index == 2)
                #expect(error.error == .queueNotFound("nope"))
            }
            #expect(!f.engine.holdsBatchPart("t3"))
            _ = try f.engine.prepareBatchPart("t4", [Self.manual("a")], mine: [0])
            #expect(throws: BatchRefusal.self) { try f.engine.prepareBatchPart("t4", [Self.manual("a")], mine: [0]) }
            // A part whose queue is not here is left out whole; one that is, added.
            let mixed = try f.engine.applyBatchPart(
                "t5", [Self.manual("gone"), Self.manual("a")], parts: [(1, [0]), (2, [1])], ids: [OperationID(raw: 1 << 40), OperationID(raw: 1 << 40 | 1)])
            #expect(mixed.notHere == [1])
            #expect(mixed.statuses.keys.sorted() == [1])
        }

        @Test("a part let go after its batch may have been committed keeps its ids used: they are never given out twice")
        func letGoKeepsIDs() throws {
            let f = Fixture()
            _ = try f.queue("a", suspended: true)
            let ids = try f.engine.prepareBatchPart("t6", [Self.manual("a")], mine: [0])
            #expect(f.engine.releaseBatchPart("t6"))
            #expect(try f.add("a") > ids[0])
        }

        @Test("ids set aside count in the limits on unfinished operations")
        func heldCountInLimits() throws {
            let f = Fixture(configuration: EngineConfiguration(maxUnfinishedPerQueue: 2))
            _ = try f.queue("a", suspended: true)
            _ = try f.engine.prepareBatchPart("t7", [Self.manual("a"), Self.manual("a")], mine: [0, 1])
            #expect(throws: EngineError.self) { try f.add("a") }
            f.engine.releaseBatchPart("t7")
            _ = try f.add("a")
        }
    }
}
