import Dispatch
import QueueEngine
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Engine {
    @Suite("Queues")
    struct QueueTests {
        @Test("deleting a queue with unfinished operations is refused and changes nothing")
        func deleteBusy() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            let a = try f.add("q"), b = try f.add("q")
            #expect(throws: EngineError.queueNotIdle("q", unfinished: 2)) { try f.engine.deleteQueue("q") }
            #expect(try f.engine.queue(named: "q").operationCount == 2)
            #expect(try f.state(a) == .executing)
            #expect(try f.state(b) == .ready)
            #expect(f.kind.calls(.cancel, for: a).isEmpty)
        }

        @Test("deleting a busy queue with force cancels its operations, releases their dependents and removes it")
        func deleteForced() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            try f.queue("r")
            let a = try f.add("q"), b = try f.add("q")
            let afterB = try f.add("r", after: [b])
            let afterA = try f.add("r", after: [a])
            try f.engine.deleteQueue("q", force: true)
            #expect(throws: EngineError.queueNotFound("q")) { try f.engine.queue(named: "q") }
            #expect(!f.engine.queues().map(\.name).contains("q"))
            #expect(!f.kind.wasStarted(b))
            // A deleted queue's operations may be forgotten with it; if b is still known, it is cancelled.
            if let s = try? f.snapshot(b) { #expect(s.state == .finished && s.outcome == .cancelled) }
            #expect(f.kind.calls(.cancel, for: a).count == 1, "the executing one is asked to stop")
            #expect(try f.state(afterB) == .executing, "a cancelled dependency counts as finished")
            #expect(try f.state(afterA) == .pending, "a is still winding down")
            f.kind.finish(a)
            #expect(try f.state(afterA) == .executing)
            if let s = try? f.snapshot(a) { #expect(s.state == .finished && s.outcome == .cancelled) }
        }

        @Test("an idle queue can be deleted and its name used again")
        func deleteIdle() throws {
            let f = Fixture()
            try f.queue("q")
            let a = try f.add("q")
            f.kind.finish(a)
            try f.engine.deleteQueue("q")
            #expect(throws: EngineError.queueNotFound("q")) { try f.engine.deleteQueue("q") }
            try f.queue("q", max: 3)
            #expect(try f.engine.queue(named: "q").maxConcurrentOperationCount == 3)
        }

        @Test("waitUntilIdle returns once the queue has drained, not before")
        func waitUntilIdle() async throws {
            let f = Fixture()
            try f.queue("q")
            let a = try f.add("q"), b = try f.add("q", after: [a])
            let returned = Locked(false)
            let waiter = Task {
                try await f.engine.waitUntilIdle("q")
                returned.withLock { $0 = true }
            }
            try await Task.sleep(for: .milliseconds(50))
            #expect(!returned.value)
            f.kind.finish(a)
            try await Task.sleep(for: .milliseconds(20))
            #expect(!returned.value, "b is still executing")
            f.kind.finish(b)
            #expect(await eventually { returned.value })
            if returned.value { try await waiter.value }
        }

        @Test("waitUntilIdle returns at once for an idle queue and throws for an unknown one")
        func waitUntilIdleImmediate() async throws {
            let f = Fixture()
            try f.queue("q")
            try await f.engine.waitUntilIdle("q")
            await #expect(throws: EngineError.queueNotFound("nope")) { try await f.engine.waitUntilIdle("nope") }
        }

        @Test("onIdle calls back exactly once when the last operation finishes, at once when idle, never after cancelIdleWait")
        func onIdle() throws {
            let f = Fixture()
            try f.queue("q", max: 2)
            let calls = Locked<[Bool]>([])
            let immediate = try f.engine.onIdle("q") { idle in calls.withLock { $0.append(idle) } }
            #expect(immediate == nil)
            #expect(calls.value == [true])

            let a = try f.add("q"), b = try f.add("q")
            calls.withLock { $0 = [] }
            let token = try f.engine.onIdle("q") { idle in calls.withLock { $0.append(idle) } }
            #expect(token != nil)
            let cancelled = Locked(0)
            let other = try #require(try f.engine.onIdle("q") { _ in cancelled.withLock { $0 += 1 } })
            #expect(f.engine.cancelIdleWait("q", token: other))

            f.kind.finish(a)
            #expect(calls.value.isEmpty)
            f.kind.finish(b)
            #expect(calls.value == [true])
            #expect(cancelled.value == 0)
            #expect(!f.engine.cancelIdleWait("q", token: token!), "it already fired")
            _ = try f.add("q")
            #expect(calls.value == [true], "a waiter fires once")
        }

        @Test("an operation with notBefore 200 ms ahead does not start before that time")
        func notBefore() throws {
            let f = Fixture()
            try f.queue("q")
            let notBefore = f.clock.now().adding(seconds: 0.2)
            let id = try f.add("q", notBefore: notBefore)
            #expect(try f.state(id) == .pending)
            f.clock.advance(seconds: 0.1999)
            #expect(f.kind.started.isEmpty)
            #expect(try f.state(id) == .pending)

            f.clock.advance(seconds: 0.0011)  // the wake-up comes a millisecond late
            #expect(f.kind.started == [id], "it starts once the time has come")
            let startedAt = try #require(try f.snapshot(id).startedAt)
            #expect(startedAt >= notBefore)
            #expect(startedAt.seconds - notBefore.seconds < 0.0015, "and not later than the wake-up")
        }

        @Test("a suspended queue starts nothing until resumed; executing operations run on")
        func suspend() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            let a = try f.add("q"), b = try f.add("q")
            #expect(try f.engine.suspend("q").isSuspended)
            f.kind.finish(a)
            #expect(try f.state(b) == .ready)
            #expect(!f.kind.wasStarted(b))
            #expect(try !f.engine.resumeQueue("q").isSuspended)
            #expect(try f.state(b) == .executing)
        }

        @Test("widening a queue's limit starts waiting operations at once")
        func widen() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            _ = try f.add("q"); let b = try f.add("q"), c = try f.add("q"), d = try f.add("q")
            try f.engine.updateQueue("q", maxConcurrentOperationCount: 3)
            #expect(try [b, c].map(f.state) == [.executing, .executing])
            #expect(try f.state(d) == .ready)
            #expect(try f.engine.queue(named: "q").counts[.executing] == 3)
        }

        @Test("-1 means the configured default limit")
        func defaultLimit() throws {
            let f = Fixture(configuration: EngineConfiguration(defaultMaxConcurrentOperationCount: 2))
            let q = try f.queue("q")
            #expect(q.maxConcurrentOperationCount == -1)
            #expect(q.effectiveMaxConcurrentOperationCount == 2)
            let ids = try (0..<3).map { _ in try f.add("q") }
            #expect(try ids.map(f.state) == [.executing, .executing, .ready])
        }

        @Test("a barrier starts after every earlier operation has finished and every later one waits for it")
        func barrier() throws {
            let f = Fixture()
            try f.queue("q", max: 3)
            let a = try f.add("q"), b = try f.add("q")
            let barrier = try f.engine.addBarrier(to: "q").id
            let c = try f.add("q")
            #expect(try f.state(barrier) == .pending)
            #expect(try f.state(c) == .pending)
            f.kind.finish(a)
            #expect(try f.state(barrier) == .pending)
            f.kind.finish(b)
            #expect(try f.snapshot(barrier).outcome == .succeeded)
            #expect(try f.state(c) == .executing)
            #expect(f.kind.started == [a, b, c])
        }

        @Test("operations are listed oldest first, in pages, optionally by state")
        func listing() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            let ids = try (0..<5).map { _ in try f.add("q") }
            let first = try f.engine.operations(in: "q", limit: 2)
            #expect(first.operations.map(\.id) == Array(ids[0..<2]))
            let second = try f.engine.operations(in: "q", after: first.next, limit: 2)
            #expect(second.operations.map(\.id) == Array(ids[2..<4]))
            let third = try f.engine.operations(in: "q", after: second.next, limit: 2)
            #expect(third.operations.map(\.id) == [ids[4]])
            #expect(third.next == nil)
            #expect(try f.engine.operations(in: "q", state: .ready).operations.map(\.id) == Array(ids[1...]))
        }
    }
}

extension Engine {
    @Suite("Refused requests")
    struct ErrorTests {
        @Test("an unknown operation id is operationNotFound everywhere")
        func unknownOperation() throws {
            let f = Fixture()
            try f.queue("q", suspended: true)
            let ghost = OperationID(raw: 424242)
            let e = EngineError.operationNotFound(ghost.description)
            #expect(throws: e) { try f.engine.operation(ghost) }
            #expect(throws: e) { try f.engine.revision(of: ghost) }
            #expect(throws: e) { try f.engine.cancel(ghost) }
            #expect(throws: e) { try f.engine.cancel(ghost, cascade: true) }
            #expect(throws: e) { try f.engine.pause(ghost) }
            #expect(throws: e) { try f.engine.resume(ghost) }
            #expect(throws: e) { try f.engine.update(ghost, queuePriority: .high) }
            #expect(throws: e) { try f.add("q", after: [ghost]) }
            #expect(try f.engine.queue(named: "q").operationCount == 0, "nothing half-created")
            let real = try f.add("q")
            #expect(throws: e) { try f.engine.update(real, dependencies: [ghost]) }
            #expect(try f.snapshot(real).dependencies.isEmpty)
        }

        @Test("an unknown queue is queueNotFound everywhere")
        func unknownQueue() throws {
            let f = Fixture()
            let e = EngineError.queueNotFound("nope")
            #expect(throws: e) { try f.engine.queue(named: "nope") }
            #expect(throws: e) { try f.add("nope") }
            #expect(throws: e) { try f.engine.addBarrier(to: "nope") }
            #expect(throws: e) { try f.engine.suspend("nope") }
            #expect(throws: e) { try f.engine.updateQueue("nope", maxConcurrentOperationCount: 2) }
            #expect(throws: e) { try f.engine.cancelAll("nope") }
            #expect(throws: e) { try f.engine.deleteQueue("nope") }
            #expect(throws: e) { try f.engine.onIdle("nope") { _ in } }
            #expect(throws: e) { try f.engine.operations(in: "nope") }
        }

        @Test("a duplicate queue name is queueExists")
        func duplicateQueue() throws {
            let f = Fixture()
            try f.queue("q", max: 2)
            #expect(throws: EngineError.queueExists("q")) { try f.queue("q", max: 5) }
            #expect(try f.engine.queue(named: "q").maxConcurrentOperationCount == 2)
            #expect(f.engine.queues().count == 1)
        }

        private func expectInvalidArgument(
            _ field: String, _ sourceLocation: SourceLocation = #_sourceLocation,
            _ body: () throws -> Void
        ) {
            do {
                try body()
                Issue.record("expected invalidArgument(\(field)), nothing was thrown", sourceLocation: sourceLocation)
            } catch {
                guard case .invalidArgument(let got, let detail)? = error as? EngineError, got == field else {
                    Issue.record("expected invalidArgument(\(field)), got \(error)", sourceLocation: sourceLocation)
                    return
                }
                #expect(!detail.isEmpty, sourceLocation: sourceLocation)
            }
        }

        @Test(
            "queue names outside [A-Za-z0-9._-]{1,64} are invalidArgument",
            arguments: ["", "a b", "a/b", "q?", "é", "tab\t", String(repeating: "x", count: 65)])
        func invalidName(name: String) {
            let f = Fixture()
            expectInvalidArgument("name") { try f.engine.createQueue(name: name) }
            #expect(f.engine.queues().isEmpty)
        }

        @Test(
            "queue names inside [A-Za-z0-9._-]{1,64} are accepted",
            arguments: ["a", "Q.1_x-Y", String(repeating: "z", count: 64), "-", "..."])
        func validName(name: String) throws {
            let f = Fixture()
            #expect(try f.engine.createQueue(name: name).name == name)
        }

        @Test("a limit that is neither positive nor -1 is invalidArgument", arguments: [0, -2, -100, Int.min])
        func invalidMax(max: Int) throws {
            let f = Fixture()
            expectInvalidArgument("maxConcurrentOperationCount") { try f.engine.createQueue(name: "q", maxConcurrentOperationCount: max) }
            #expect(f.engine.queues().isEmpty)
            try f.queue("r", max: 2)
            expectInvalidArgument("maxConcurrentOperationCount") { try f.engine.updateQueue("r", maxConcurrentOperationCount: max) }
            #expect(try f.engine.queue(named: "r").maxConcurrentOperationCount == 2)
        }

        @Test("an unknown kind, or the internal barrier kind, is unknownKind")
        func unknownKind() throws {
            let f = Fixture()
            try f.queue("q")
            #expect(throws: EngineError.unknownKind("nope", allowed: f.engine.kindNames)) { try f.engine.addOperation(to: "q", OperationRequest(kind: "nope")) }
            #expect(throws: EngineError.unknownKind("barrier", allowed: f.engine.kindNames)) {
                try f.engine.addOperation(to: "q", OperationRequest(kind: "barrier"))
            }
        }

        @Test("more unfinished operations than configured is limitReached")
        func limitReached() throws {
            let f = Fixture(configuration: EngineConfiguration(maxUnfinishedOperations: 2))
            try f.queue("q")
            let a = try f.add("q")
            _ = try f.add("q")
            #expect(throws: EngineError.self) { try f.add("q") }
            f.kind.finish(a)
            _ = try f.add("q")
        }
    }
}
