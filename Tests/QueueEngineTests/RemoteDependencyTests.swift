import Locking
import QueueEngine
import Testing

/// The directory a cluster gives each engine, with another engine in place of PostgreSQL: it
/// answers from `peer` and reports an end only when the test says `deliver()` (as a feed would,
/// later). It checks that every `watch` comes after the engine registered the wait.
final class PeerDirectory: RemoteOperations {
    let peer: QueueEngine
    private let owner = Locked<QueueEngine?>(nil)
    private let watched = Locked<[OperationID]>([])
    let watchesBeforeWait = Locked(0)
    let lookups = Locked(0)

    init(peer: QueueEngine) { self.peer = peer }
    func attach(_ engine: QueueEngine) {
        owner.withLock { $0 = engine }
        engine.setRemoteOperations(self)
    }

    func states(of ids: [OperationID]) throws(EngineError) -> [OperationID: Bool] {
        lookups.withLock { $0 += 1 }
        var out: [OperationID: Bool] = [:]
        for id in ids {
            if let s = try? peer.operation(id) { out[id] = s.state == .finished }
        }
        return out
    }

    func operation(_ id: OperationID) throws(EngineError) -> OperationSnapshot? { try? peer.operation(id) }

    /// Walks the peer's operations only (the engine walks its own).
    func reaches(_ target: OperationID, from ids: [OperationID]) throws(EngineError) -> Bool {
        var stack = ids
        var seen: Set<OperationID> = []
        while let id = stack.popLast() {
            if id == target { return true }
            guard seen.insert(id).inserted, let s = try? peer.operation(id), s.state != .finished else { continue }
            stack.append(contentsOf: s.dependencies)
        }
        return false
    }

    func watch(_ ids: [OperationID]) {
        let waited = Set(owner.value?.remoteWaitedFor ?? [])
        for id in ids where !waited.contains(id) { watchesBeforeWait.withLock { $0 += 1 } }
        watched.withLock { $0.append(contentsOf: ids) }
    }

    var watching: [OperationID] { watched.value }

    /// Reports every watched id the peer has finished (the same ones again on the next call),
    /// with those a cascade cancelled, as the cluster's directory reads them from the rows.
    func deliver() {
        let finished = watched.value.filter { (try? peer.operation($0).state) == .finished }
        var cascades: [OperationID: Timestamp] = [:]
        for id in finished { if let at = try? peer.operation(id).cascadeAt { cascades[id] = at } }
        owner.value?.remoteOperationsFinished(finished, cascades: cascades)
    }
}

extension Engine {
    @Suite("Dependencies held by another engine")
    struct RemoteDependencyTests {
        /// Two engines as two cluster instances: `a` holds queue "a", `b` holds queue "b", ids apart.
        struct Pair {
            let a = Fixture()
            let b = Fixture()
            let directory: PeerDirectory
            init() throws {
                directory = PeerDirectory(peer: a.engine)
                directory.attach(b.engine)
                b.engine.useIDs(1_000_001..<2_000_000)
                try a.queue("a")
                try b.queue("b")
            }
        }

        @Test("an operation waits for an unfinished one held elsewhere and starts once told it finished; a second report changes nothing")
        func waitsForRemote() throws {
            let p = try Pair()
            let x = try p.a.add("a")
            #expect(try p.a.state(x) == .executing)
            let y = try p.b.add("b", after: [x])
            #expect(x.raw < 1_000_000 && y.raw > 1_000_000)
            #expect(try p.b.state(y) == .pending)
            #expect(try p.b.snapshot(y).dependencies == [x])
            #expect(p.directory.watching == [x])
            #expect(p.directory.watchesBeforeWait.value == 0, "the wait exists before the directory is asked to watch")
            #expect(p.b.engine.remoteWaitedFor == [x])

            p.directory.deliver()
            #expect(try p.b.state(y) == .pending, "not finished yet: nothing reported")
            p.a.kind.finish(x)
            p.directory.deliver()
            #expect(try p.b.state(y) == .executing)
            #expect(p.b.engine.remoteWaitedFor.isEmpty)
            p.directory.deliver()
            p.b.engine.remoteOperationsFinished([x, OperationID(raw: 77)])
            #expect(try p.b.state(y) == .executing)
            #expect(p.b.kind.calls(.start, for: y).count == 1)
        }

        @Test("a finished one held elsewhere counts as finished at once; an id nobody holds is refused as not found")
        func finishedAndUnknown() throws {
            let p = try Pair()
            let x = try p.a.add("a")
            p.a.kind.finish(x)
            let y = try p.b.add("b", after: [x])
            #expect(try p.b.state(y) == .executing)
            #expect(p.directory.watching.isEmpty)
            #expect(throws: EngineError.operationNotFound(OperationID(raw: 999).description)) { try p.b.add("b", after: [OperationID(raw: 999)]) }
        }

        @Test("without a directory, an id the engine does not hold is refused and the directory is never asked for local ones")
        func localOnly() throws {
            let f = Fixture()
            try f.queue("q")
            #expect(throws: EngineError.self) { try f.add("q", after: [OperationID(raw: 5)]) }
            let p = try Pair()
            let x = try p.b.add("b")
            _ = try p.b.add("b", after: [x])
            #expect(p.directory.lookups.value == 0)
        }

        @Test("mixed local and remote waits: it becomes ready only when both are finished, in either order")
        func mixed() throws {
            let p = try Pair()
            let x = try p.a.add("a")
            try p.b.queue("held", suspended: false)
            let l = try p.b.add("held")
            let y = try p.b.add("b", after: [x, l])
            p.a.kind.finish(x)
            p.directory.deliver()
            #expect(try p.b.state(y) == .pending)
            p.b.kind.finish(l)
            #expect(try p.b.state(y) == .executing)
        }

        @Test("cancelling a waiting operation drops its remote wait; a later report wakes nothing")
        func cancelDropsWait() throws {
            let p = try Pair()
            let x = try p.a.add("a")
            let y = try p.b.add("b", after: [x])
            try p.b.engine.cancel(y)
            #expect(p.b.engine.remoteWaitedFor.isEmpty)
            p.a.kind.finish(x)
            p.directory.deliver()
            #expect(try p.b.snapshot(y).outcome == .cancelled)
            #expect(!p.b.kind.wasStarted(y))
            // And a bulk cancel (`cancelAll`) too.
            let x2 = try p.a.add("a")
            _ = try p.b.add("b", after: [x2])
            try p.b.engine.cancelAll("b")
            #expect(p.b.engine.remoteWaitedFor.isEmpty)
        }

        @Test("replacing dependencies (PATCH) with remote ones waits for them; replacing them again drops the old wait")
        func updateToRemote() throws {
            let p = try Pair()
            let x = try p.a.add("a")
            let gate = try p.b.add("b")
            let y = try p.b.add("b", after: [gate])
            try p.b.engine.update(y, dependencies: [x])
            #expect(p.b.engine.remoteWaitedFor == [x])
            #expect(try p.b.state(y) == .pending)
            try p.b.engine.update(y, dependencies: [])
            #expect(p.b.engine.remoteWaitedFor.isEmpty)
            #expect(try p.b.state(y) == .executing)
        }

        @Test("a batch may name operations held elsewhere; an archive keeps a remote dependency that is unfinished")
        func batchAndArchive() throws {
            let p = try Pair()
            let x = try p.a.add("a")
            let made = try p.b.engine.addOperations([
                BatchElement(queue: "b", request: OperationRequest(kind: "manual"), dependencies: [.operation(x)]),
                BatchElement(queue: "b", request: OperationRequest(kind: "manual"), dependencies: [.element(0)]),
            ])
            #expect(made.map(\.state) == [.pending, .pending])
            #expect(made[0].dependencies == [x])
            let archive = try p.b.engine.archive(queue: "b", limit: 100)
            #expect(archive.operations.first?.dependencies == [x])
            #expect(throws: BatchRefusal.self) {
                try p.b.engine.addOperations([
                    BatchElement(queue: "b", request: OperationRequest(kind: "manual"), dependencies: [.operation(OperationID(raw: 4242))])
                ])
            }
            p.a.kind.finish(x)
            p.directory.deliver()
            #expect(try p.b.state(made[0].id) == .executing)
        }

        @Test("release: the queue's operations leave, runs are stopped without a change being written, and dependents held here wait remotely")
        func release() throws {
            let f = Fixture()
            try f.queue("a", max: 1)
            try f.queue("b")
            let x = try f.add("a")
            let queued = try f.add("a")
            let y = try f.add("b", after: [x])
            let z = try f.add("b", after: [queued])
            let log = EventLog(f.engine)
            let recordsBefore = f.engine.currentTicket

            #expect(!f.engine.wasReleased(x))
            f.engine.release(queues: ["a"])
            #expect(throws: EngineError.self) { try f.engine.operation(x) }
            #expect(f.engine.wasReleased(x) && f.engine.wasReleased(queued) && !f.engine.wasReleased(y), "a wait for x is answered \"moved\"")
            #expect(throws: EngineError.self) { try f.engine.queue(named: "a") }
            #expect(f.engine.queues().map(\.name) == ["b"])
            #expect(f.kind.calls(.cancel, for: x).count == 1, "its run is stopped")
            #expect(f.engine.remoteWaitedFor == [x, queued])
            #expect(try f.state(y) == .pending && f.state(z) == .pending)
            #expect(log.all.isEmpty, "nothing is reported about operations it no longer holds")
            #expect(f.engine.currentTicket == recordsBefore, "nothing is written")
            // The stopped run's report comes too late and changes nothing.
            f.kind.finish(x)
            #expect(log.all.isEmpty)
            // The peer that took it over reports the end.
            f.engine.remoteOperationsFinished([x])
            #expect(try f.state(y) == .executing)
        }

        @Test("release: finish waits and idle waits on the queue end at once, and the queue is known to have moved until it is held or made again")
        func releaseEndsWaits() throws {
            let f = Fixture()
            try f.queue("a")
            try f.queue("b")
            let x = try f.add("a")
            let y = try f.add("b")
            let told = Locked<[String]>([])
            #expect(try f.engine.onFinished(x) { told.withLock { $0.append("x finished or gone") } } != nil)
            #expect(try f.engine.onFinished(y) { told.withLock { $0.append("y") } } != nil)
            #expect(try f.engine.onIdle("a") { idle in told.withLock { $0.append("a idle \(idle)") } } != nil)
            #expect(!f.engine.wasReleased(queue: "a"))
            let observed = f.engine.operationObserverCount
            let savedA = try f.engine.queue(named: "a")
            f.engine.release(queues: ["a"])
            #expect(told.withLock { $0.sorted() } == ["a idle false", "x finished or gone"], "the waits on what left end now, not at their timeouts")
            #expect(f.engine.operationObserverCount == observed - 1, "the wait on x is dropped with it")
            #expect(f.engine.wasReleased(x) && f.engine.wasReleased(queue: "a"))
            #expect(!f.engine.wasReleased(queue: "b") && !f.engine.wasReleased(queue: "never"))
            // Made here again (it came back), then deleted: no longer "moved".
            let saved = RecoveredState(queues: [savedA], operations: [])
            f.engine.adopt(saved, remote: RemoteStates(finished: [:]))
            #expect(!f.engine.wasReleased(queue: "a"), "held again")
            try f.engine.deleteQueue("a")
            #expect(!f.engine.wasReleased(queue: "a"), "deleted, not moved")
            f.kind.finish(y)
            #expect(told.withLock { $0.contains("y") })
        }

        @Test("adopt: a queue comes back with its operations; waits held here become local again, and the adopted ones wait remotely for what is elsewhere")
        func adopt() throws {
            let peer = Fixture()
            try peer.queue("elsewhere")
            let f = Fixture()
            let directory = PeerDirectory(peer: peer.engine)
            directory.attach(f.engine)
            f.engine.useIDs(1_001..<2_000)
            try f.queue("a", max: 1)
            try f.queue("b")
            let r = try peer.add("elsewhere")
            let first = try f.add("a")
            let x = try f.add("a")
            let w = try f.add("a", after: [r])
            let y = try f.add("b", after: [x])
            #expect(f.engine.remoteWaitedFor == [r])
            let saved = RecoveredState(queues: [try f.engine.queue(named: "a")], operations: try [first, x, w].map { try f.snapshot($0) })

            f.engine.release(queues: ["a"])
            #expect(f.engine.remoteWaitedFor == [x], "y waits for x remotely; w left with its queue")
            #expect(f.engine.wasReleased(x))
            f.engine.adopt(saved, remote: RemoteStates(finished: [r: false]))
            #expect(!f.engine.wasReleased(x), "taken in again")
            #expect(f.engine.remoteWaitedFor == [r], "y waits for x here again; w waits for r elsewhere")
            // `first` was executing: the manual kind's recovery fails it, and x starts.
            #expect(try f.snapshot(first).outcome == .failed)
            #expect(try f.state(x) == .executing)
            #expect(try f.state(w) == .pending)
            f.kind.finish(x)
            #expect(try f.state(y) == .executing)
            peer.kind.finish(r)
            directory.deliver()
            #expect(try f.state(w) == .executing)
            #expect(f.engine.remoteWaitedFor.isEmpty)
            // A queue already held is left alone.
            #expect(f.engine.idsLeft == 2_000 - 1_005)
            f.engine.adopt(saved, remote: RemoteStates())
            #expect(try f.state(x) == .finished)
        }

        @Test("a cascade reaches dependents held elsewhere: they and their own dependents are cancelled, never started, and carry the mark on")
        func cascadeAcrossEngines() throws {
            let p = try Pair()
            let x = try p.a.add("a", notBefore: Timestamp(nanoseconds: Int64.max))  // pending: never starts by itself
            let y = try p.b.add("b", after: [x])
            let z = try p.b.add("b", after: [y])
            let plain = try p.a.add("a", notBefore: Timestamp(nanoseconds: Int64.max))
            let w = try p.b.add("b", after: [plain])
            p.a.clock.advance(seconds: 1)
            try p.a.engine.cancel(x, cascade: true)
            let mark = try #require(try p.a.snapshot(x).cascadeAt)
            #expect(mark == p.a.clock.now())
            #expect(try p.b.state(y) == .pending, "not told yet")
            p.directory.deliver()
            for id in [y, z] {
                let s = try p.b.snapshot(id)
                #expect(s.state == .finished && s.outcome == .cancelled, "\(id)")
                #expect(s.cascadeAt != nil, "\(id) carries the cascade to its own remote dependents")
                #expect(!p.b.kind.wasStarted(id))
            }
            // Without `cascade`, a cancelled dependency counts as finished, as in Foundation.
            try p.a.engine.cancel(plain)
            #expect(try p.a.snapshot(plain).cascadeAt == nil)
            p.directory.deliver()
            #expect(try p.b.state(w) == .executing)
        }

        @Test("an executing operation cancelled with cascade is marked at once; its remote dependents are cancelled when it has stopped")
        func cascadeOfExecuting() throws {
            let p = try Pair()
            let x = try p.a.add("a")
            #expect(try p.a.state(x) == .executing)
            let y = try p.b.add("b", after: [x])
            try p.a.engine.cancel(x)
            try p.a.engine.cancel(x, cascade: true)  // asked to stop already: the mark is still set
            #expect(try p.a.snapshot(x).cascadeAt != nil)
            #expect(try p.a.state(x) == .executing, "stopping")
            p.directory.deliver()
            #expect(try p.b.state(y) == .pending)
            // Added after the cascade was asked, while x is still stopping: it runs once x has
            // stopped, as a local dependent added then would.
            p.b.clock.advance(seconds: 1)
            let late = try p.b.add("b", after: [x])
            p.a.kind.finish(x, .failed(type: "cancelled", detail: "stopped"))
            p.directory.deliver()
            #expect(try p.b.snapshot(y).outcome == .cancelled)
            #expect(!p.b.kind.wasStarted(y))
            #expect(try p.b.state(late) == .executing)
        }

        @Test("a dependency change that would close a cycle through an operation held elsewhere is refused, and changes nothing")
        func cycleThroughPeer() throws {
            let p = try Pair()
            let x = try p.b.add("b", notBefore: Timestamp(nanoseconds: Int64.max))
            let mine = try p.b.add("b", notBefore: Timestamp(nanoseconds: Int64.max))
            // a's y waits for b's x; a second directory lets a see b's operations.
            let back = PeerDirectory(peer: p.b.engine)
            back.attach(p.a.engine)
            let y = try p.a.add("a", after: [x])
            #expect {
                try p.b.engine.update(x, dependencies: [y])
            } throws: { error in
                if case .dependencyCycle = error as? EngineError { return true }
                return false
            }
            #expect(try p.b.snapshot(x).dependencies == [])
            #expect(p.a.engine.remoteWaitedFor == [x] && p.b.engine.remoteWaitedFor.isEmpty)
            // A change that closes no cycle goes through.
            #expect(try p.b.engine.update(mine, dependencies: [x]).dependencies == [x])
        }

        @Test("a copy into a queue held here of an operation held elsewhere takes its kind, spec, options and dependencies")
        func copyFromPeer() throws {
            let p = try Pair()
            let dep = try p.a.add("a")
            let later = Timestamp(nanoseconds: Int64.max)
            let source = try p.a.engine.addOperationID(
                to: "a",
                OperationRequest(
                    kind: "manual", name: "source", queuePriority: .high, dependencies: [dep], spec: .object([("n", .number(1))]),
                    options: OperationOptions(timeout: 5, notBefore: later)))
            let copy = try p.b.engine.copyOperation(source, CopyOverrides(queue: "b"))
            #expect(copy.queue == "b" && copy.kind == "manual" && copy.name == "source" && copy.queuePriority == .high)
            #expect(copy.spec == .object([("n", .number(1))]) && copy.options.timeout == 5 && copy.options.notBefore == later)
            #expect(copy.dependencies == [dep] && copy.state == .pending, "waits for the source's dependency, held elsewhere")
            #expect(p.b.engine.remoteWaitedFor == [dep])
            #expect(throws: EngineError.self) { try p.b.engine.copyOperation(OperationID(raw: 999), CopyOverrides(queue: "b")) }
            let barrier = try p.a.engine.addBarrier(to: "a")
            #expect(throws: EngineError.self) { try p.b.engine.copyOperation(barrier.id, CopyOverrides(queue: "b")) }
        }

        @Test("an operation added after the cascade, naming the cancelled one, is not cancelled by it")
        func addedAfterCascade() throws {
            let p = try Pair()
            let x = try p.a.add("a", notBefore: Timestamp(nanoseconds: Int64.max))
            try p.a.engine.cancel(x, cascade: true)
            let y = try p.b.add("b", after: [x])
            #expect(try p.b.state(y) == .executing)
        }

        @Test("adopt finishes a cascade its old owner did not: operations added before it are cancelled, later ones run")
        func adoptFinishesCascade() throws {
            let f = Fixture()
            f.engine.setRemoteOperations(PeerDirectory(peer: Fixture().engine))
            try f.queue("b")
            let before = try f.add("b", notBefore: Timestamp(nanoseconds: Int64.max))
            f.clock.advance(seconds: 10)
            let after = try f.add("b", notBefore: Timestamp(nanoseconds: Int64.max))
            let x = OperationID(raw: 5_000_000)
            var saved = RecoveredState(queues: [try f.engine.queue(named: "b")], operations: try [before, after].map { try f.snapshot($0) })
            for i in saved.operations.indices {
                saved.operations[i].dependencies = [x]
                saved.operations[i].options = OperationOptions()
            }
            let other = Fixture()
            other.engine.setRemoteOperations(PeerDirectory(peer: Fixture().engine))
            let at = Timestamp(nanoseconds: f.clock.now().nanoseconds - 5_000_000_000)  // between the two adds
            other.engine.adopt(saved, remote: RemoteStates(finished: [x: true], cascades: [x: at]))
            #expect(try other.snapshot(before).outcome == .cancelled)
            #expect(try other.snapshot(before).cascadeAt != nil)
            #expect(try other.state(after) == .executing)
            // A single instance (no directory) commits its cascades whole: nothing to finish.
            let single = Fixture()
            single.engine.restore(saved, remote: [x: true], cascades: [x: at])
            #expect(try single.state(before) == .executing)
        }

        @Test("ids come from the block given, only grow, and adding stops at its end until the next block")
        func idBlocks() throws {
            let f = Fixture()
            try f.queue("q")
            f.engine.useIDs(10..<12)
            #expect(try f.add("q").raw == 10)
            #expect(throws: BatchRefusal.self) {
                try f.engine.addOperations((0..<2).map { _ in BatchElement(queue: "q", request: OperationRequest(kind: "manual")) })
            }
            #expect(try f.add("q").raw == 11)
            #expect(throws: EngineError.self) { try f.add("q") }
            #expect(f.engine.queues().first?.operationCount == 2, "the refused ones changed nothing")
            f.engine.useIDs(5..<100)
            #expect(try f.add("q").raw == 12, "a block below the ids held starts above them")
            f.engine.useIDs(1000..<2000)
            #expect(try f.add("q").raw == 1000)
        }

        @Test("operations of blocks far apart are all kept, and a table slot is not made for every id between them")
        func farApartBlocks() throws {
            let f = Fixture()
            try f.queue("q")
            f.engine.useIDs(1 << 24..<2 << 24)
            let a = try f.add("q")
            f.engine.useIDs(5 << 24..<6 << 24)
            let b = try f.add("q")
            let c = try f.add("q", after: [a])
            #expect(f.engine.tableSpan <= 2)
            let peer = Fixture()
            try peer.queue("other")
            peer.engine.useIDs(3 << 24..<4 << 24)
            let m = try peer.add("other")
            let saved = RecoveredState(queues: [try peer.engine.queue(named: "other")], operations: [try peer.snapshot(m)])
            f.engine.adopt(saved, remote: RemoteStates())
            for id in [a, b, c, m] { #expect((try? f.engine.operation(id)) != nil, "\(id)") }
            #expect(f.engine.tableSpan <= 2)
            f.kind.finish(a)
            #expect(try f.state(c) == .executing)
        }
    }
}
