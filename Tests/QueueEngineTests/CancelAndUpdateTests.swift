import QueueEngine
import Testing

extension Engine {
    @Suite("Cancel")
    struct CancelTests {
        @Test("cancelling a pending operation finishes it cancelled without running it, and its dependents still run")
        func cancelPending() throws {
            let f = Fixture()
            try f.queue("x")
            try f.queue("q")
            let x = try f.add("x")
            let op = try f.add("q", after: [x])
            let dependent = try f.add("q", after: [op])

            let s = try f.engine.cancel(op)
            #expect(s.state == .finished)
            #expect(s.outcome == .cancelled)
            #expect(s.isCancelled)
            #expect(!f.kind.wasStarted(op))
            #expect(try f.state(dependent) == .executing, "a cancelled dependency counts as finished, as in Foundation")
            #expect(try f.state(x) == .executing)
        }

        @Test("cancel with cascade cancels every transitive dependent and leaves everything else alone")
        func cascade() throws {
            let f = Fixture()
            try f.queue("x")
            try f.queue("q")
            try f.queue("o", max: 1)
            let x = try f.add("x")
            let root = try f.add("q", after: [x])
            let child = try f.add("q", after: [root])
            let grandchild = try f.add("o", after: [child])
            let unrelatedRunning = try f.add("o")
            let crossDependent = try f.add("o", after: [unrelatedRunning, root])
            let sibling = try f.add("q", after: [x])
            let unrelatedReady = try f.add("o")

            try f.engine.cancel(root, cascade: true)

            for id in [root, child, grandchild, crossDependent] {
                let s = try f.snapshot(id)
                #expect(s.state == .finished && s.outcome == .cancelled && s.isCancelled, "\(id) is cancelled")
                #expect(!f.kind.wasStarted(id))
            }
            #expect(try f.state(x) == .executing)
            #expect(try f.state(unrelatedRunning) == .executing)
            #expect(try f.state(sibling) == .pending)
            #expect(try f.state(unrelatedReady) == .ready)
            for id in [x, unrelatedRunning, sibling, unrelatedReady] {
                #expect(try f.snapshot(id).isCancelled == false)
            }
        }

        @Test("without cascade, only the operation itself is cancelled")
        func noCascade() throws {
            let f = Fixture()
            try f.queue("q", suspended: true)
            let root = try f.add("q")
            let child = try f.add("q", after: [root])
            try f.engine.cancel(root)
            #expect(try f.snapshot(root).outcome == .cancelled)
            #expect(try f.state(child) == .ready)
            #expect(try f.snapshot(child).isCancelled == false)
        }

        @Test("cascading from an executing operation cancels its dependents at once and it finishes cancelled when its kind stops")
        func cascadeFromExecuting() throws {
            let f = Fixture()
            try f.queue("q")
            let root = try f.add("q")
            let child = try f.add("q", after: [root])
            let s = try f.engine.cancel(root, cascade: true)
            #expect(s.state == .executing && s.isCancelled, "isCancelled can be true while it winds down")
            #expect(f.kind.calls(.cancel, for: root).count == 1)
            #expect(try f.snapshot(child).outcome == .cancelled)

            f.kind.finish(root, .succeeded(.null))
            let done = try f.snapshot(root)
            #expect(done.state == .finished)
            #expect(done.outcome == .cancelled, "work that ends after a cancel is cancelled, whatever the kind reports")
        }

        @Test("cancelling an executing operation twice asks its kind once")
        func cancelTwice() throws {
            let f = Fixture()
            try f.queue("q")
            let a = try f.add("q")
            try f.engine.cancel(a)
            try f.engine.cancel(a)
            #expect(f.kind.calls(.cancel, for: a).count == 1)
        }

        @Test("cancelling a finished operation is refused")
        func cancelFinished() throws {
            let f = Fixture()
            try f.queue("q")
            let a = try f.add("q")
            f.kind.finish(a)
            #expect(throws: EngineError.invalidTransition(from: .finished, action: .cancel)) { try f.engine.cancel(a) }
            #expect(try f.snapshot(a).outcome == .succeeded)
        }

        @Test("cancelAll cancels every unfinished operation of the queue and only that queue")
        func cancelAll() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            try f.queue("other")
            let running = try f.add("q"), ready = try f.add("q")
            let pending = try f.add("q", after: [ready])
            let elsewhere = try f.add("other")
            let snap = try f.engine.cancelAll("q")
            #expect(snap.operationCount == 1, "only the executing one is left, winding down")
            #expect(try f.snapshot(running).isCancelled && f.state(running) == .executing)
            #expect(try f.snapshot(ready).outcome == .cancelled)
            #expect(try f.snapshot(pending).outcome == .cancelled)
            #expect(try !f.snapshot(elsewhere).isCancelled)
            f.kind.finish(running)
            #expect(try f.engine.queue(named: "q").operationCount == 0)
        }
    }
}

extension Engine {
    @Suite("Dependencies, priorities and updates")
    struct UpdateTests {
        private func expectCycle(sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> OperationSnapshot) {
            do {
                let s = try body()
                Issue.record("a dependency cycle was accepted: \(s.id) now depends on \(s.dependencies)", sourceLocation: sourceLocation)
            } catch {
                guard case .dependencyCycle(let detail)? = error as? EngineError else {
                    Issue.record("expected dependencyCycle, got \(error)", sourceLocation: sourceLocation)
                    return
                }
                #expect(!detail.isEmpty, sourceLocation: sourceLocation)
            }
        }

        @Test("a self-dependency is refused as a cycle and changes nothing")
        func selfCycle() throws {
            let f = Fixture()
            try f.queue("q", suspended: true)
            let a = try f.add("q")
            let before = try f.snapshot(a)
            let seq = f.engine.nextSequence
            expectCycle { try f.engine.update(a, queuePriority: .high, dependencies: [a]) }
            #expect(try f.snapshot(a) == before)
            #expect(f.engine.nextSequence == seq, "no change was reported")
        }

        @Test("closing a two- or three-operation cycle is refused and changes nothing")
        func longerCycles() throws {
            let f = Fixture()
            try f.queue("q", max: 1, suspended: true)
            try f.queue("r")
            let a = try f.add("q")
            let b = try f.add("r", after: [a])
            let c = try f.add("q", after: [b])
            let before = try [a, b, c].map { try f.snapshot($0) }
            let seq = f.engine.nextSequence

            for (id, deps) in [(a, [c]), (a, [b]), (b, [c]), (a, [b, c])] {
                expectCycle { try f.engine.update(id, queuePriority: .veryHigh, dependencies: deps) }
            }
            #expect(try [a, b, c].map { try f.snapshot($0) } == before, "neither priority nor dependencies changed")
            #expect(f.engine.nextSequence == seq)

            // The graph still works as before.
            try f.engine.resumeQueue("q")
            #expect(f.kind.started == [a])
            f.kind.finish(a)
            f.kind.finish(b)
            #expect(f.kind.started == [a, b, c])
        }

        @Test("a dependency on an unrelated chain is not a cycle")
        func notACycle() throws {
            let f = Fixture()
            try f.queue("q", suspended: true)
            let a = try f.add("q"), b = try f.add("q", after: [a]), c = try f.add("q", after: [a])
            let s = try f.engine.update(c, dependencies: [a, b])
            #expect(s.dependencies == [a, b])
        }

        @Test("raising or lowering the priority of ready operations reorders them")
        func priorityChange() throws {
            let f = Fixture()
            try f.queue("q", max: 1, suspended: true)
            let log = EventLog(f.engine)
            let a = try f.add("q"), b = try f.add("q"), c = try f.add("q"), d = try f.add("q")
            let s = try f.engine.update(d, queuePriority: .veryHigh)
            #expect(s.queuePriority == .veryHigh)
            try f.engine.update(a, queuePriority: .veryLow)
            try f.engine.update(b, queuePriority: .low)
            try f.engine.update(b, queuePriority: .normal)  // and back: b is again just "added before c"

            try f.engine.resumeQueue("q")
            for id in [d, b, c] { f.kind.finish(id) }
            #expect(f.kind.started == [d, b, c, a])
            #expect(log.of(d).filter { $0.key == .queuePriority }.map(describe) == ["queuePriority: normal->veryHigh"])
        }

        @Test("replacing the dependencies of a pending operation with finished ones makes it ready")
        func pendingToReady() throws {
            let f = Fixture()
            try f.queue("x")
            try f.queue("q")
            let x = try f.add("x")
            let done = try f.add("x")
            f.kind.finish(done)
            let op = try f.add("q", after: [x])
            #expect(try f.state(op) == .pending)

            let s = try f.engine.update(op, dependencies: [done])
            #expect(s.dependencies == [done])
            #expect(try f.state(op) == .executing, "ready, and the queue had a free slot")
            f.kind.finish(x)  // the old dependency finishing later changes nothing
            #expect(try f.state(op) == .executing)
        }

        @Test("replacing the dependencies of a ready operation with unfinished ones makes it pending")
        func readyToPending() throws {
            let f = Fixture()
            try f.queue("x")
            try f.queue("q", suspended: true)
            let y = try f.add("x")
            let op = try f.add("q")
            #expect(try f.state(op) == .ready)

            #expect(try f.engine.update(op, dependencies: [y]).state == .pending)
            try f.engine.resumeQueue("q")
            #expect(try f.state(op) == .pending)
            f.kind.finish(y)
            #expect(try f.state(op) == .executing)
        }

        @Test("an operation no longer waits for dependencies that were replaced")
        func replacedDependencyReleased() throws {
            let f = Fixture()
            try f.queue("x")
            try f.queue("q")
            let x = try f.add("x"), y = try f.add("x")
            let op = try f.add("q", after: [x])
            try f.engine.update(op, dependencies: [y])
            f.kind.finish(y)
            #expect(try f.state(op) == .executing)
            #expect(try f.state(x) == .executing)
        }

        @Test("changing an operation after it has started is refused")
        func updateAfterStart() throws {
            let f = Fixture()
            try f.queue("q")
            let running = try f.add("q"), pausedMidRun = try f.add("q"), finished = try f.add("q")
            try f.engine.pause(pausedMidRun)
            f.kind.finish(finished)
            for id in [running, pausedMidRun, finished] {
                #expect(throws: EngineError.alreadyStarted(id.description)) { try f.engine.update(id, queuePriority: .high) }
                #expect(throws: EngineError.alreadyStarted(id.description)) { try f.engine.update(id, dependencies: []) }
                #expect(try f.snapshot(id).queuePriority == .normal)
            }
        }

        @Test("replacing the dependencies of an operation added after a barrier keeps it waiting for the barrier")
        func barrierSurvivesDependencyReplacement() throws {
            let f = Fixture()
            try f.queue("q", max: 2)
            try f.queue("x")
            let before = try f.add("q")
            let barrier = try f.engine.addBarrier(to: "q").id
            let after = try f.add("q")
            let other = try f.add("x")
            try f.engine.update(after, dependencies: [other])
            f.kind.finish(other)
            #expect(try f.state(before) == .executing)
            #expect(try f.state(barrier) == .pending)
            #expect(
                try f.state(after) != .executing,
                "API.md: every operation added after a barrier waits for it; replacing the dependencies must not drop that")
        }
    }
}
