import Dispatch
import Foundation
import QueueEngine
import Testing

extension Engine {
    @Suite("Copy, bulk cancel, waitUntilFinished and filtered listing")
    struct CopyBulkCancelWaitTests {
        // MARK: - copy

        @Test("a copy has the source's kind, name, spec, options and priority, starts afresh, and leaves the source alone")
        func copyKeepsConfiguration() throws {
            let f = Fixture()
            try f.queue("q")
            let opts = OperationOptions(timeout: 9, retry: RetryPolicy(maxAttempts: 3, backoff: 2, multiplier: 3))
            let src = try f.engine.addOperationID(
                to: "q", OperationRequest(kind: "manual", name: "job", queuePriority: .high, spec: .object([("n", .number(1))]), options: opts))
            f.kind.finish(src, .failed(type: "boom", detail: "it failed"))
            // Three attempts: the retry policy keeps it executing between them.
            f.clock.advance(seconds: 2)
            f.kind.finish(src, .failed(type: "boom", detail: "it failed"))
            f.clock.advance(seconds: 6)
            f.kind.finish(src, .failed(type: "boom", detail: "it failed"))
            let failed = try f.snapshot(src)
            #expect(failed.outcome == .failed && failed.attempt == 3)

            let copy = try f.engine.copyOperation(src)
            #expect(copy.id != src)
            #expect(copy.queue == "q" && copy.kind == "manual" && copy.name == "job")
            #expect(copy.spec == .object([("n", .number(1))]))
            #expect(copy.options.timeout == 9 && copy.options.retry == opts.retry)
            #expect(copy.queuePriority == .high)
            #expect(copy.state == .executing && copy.attempt == 1, "a fresh run: attempt 1")
            #expect(copy.outcome == nil && copy.result == nil && copy.error == nil && !copy.isCancelled && copy.finishedAt == nil)
            #expect(try f.snapshot(src) == failed, "the source is not changed")
            f.kind.finish(copy.id, .succeeded(.string("ok")))
            #expect(try f.snapshot(copy.id).outcome == .succeeded)
        }

        @Test(
            "a copy of a cancelled operation that never ran runs (as a new Foundation operation with the same work does); a copy of an executing one runs beside it"
        )
        func copyRunsAgain() throws {
            // Foundation: a cancelled operation finishes without running and can never be
            // enqueued again; a new operation with the same work (what a copy is) runs.
            let ran = Locked<[String]>([])
            let queue = OperationQueue()
            queue.isSuspended = true
            let work: @Sendable (String) -> Void = { label in ran.withLock { $0.append(label) } }
            let original = BlockOperation { work("original") }
            queue.addOperation(original)
            original.cancel()
            let copied = BlockOperation { work("copy") }
            copied.queuePriority = original.queuePriority
            queue.addOperation(copied)
            queue.isSuspended = false
            queue.waitUntilAllOperationsAreFinished()
            #expect(ran.value == ["copy"])
            #expect(original.isFinished && original.isCancelled && copied.isFinished && !copied.isCancelled)

            let f = Fixture()
            try f.queue("q", suspended: true)
            let src = try f.add("q", name: "never")
            try f.engine.cancel(src)
            let copy = try f.engine.copyOperation(src)
            #expect(copy.state == .ready && !copy.isCancelled)
            try f.engine.resumeQueue("q")
            #expect(f.kind.wasStarted(copy.id) && !f.kind.wasStarted(src))
            let again = try f.engine.copyOperation(copy.id)
            #expect(again.state == .executing, "the source is executing; the copy is another operation")
        }

        @Test("the body's queue, priority, dependencies and notBefore win over the source's")
        func copyOverrides() throws {
            let f = Fixture()
            try f.queue("a", suspended: true)
            try f.queue("b", suspended: true)
            let dep = try f.add("a")
            let later = f.clock.now().adding(seconds: 60)
            let src = try f.add("a", priority: .low, after: [dep], notBefore: later)
            let same = try f.engine.copyOperation(src)
            #expect(same.dependencies == [dep] && same.state == .pending && same.options.notBefore == later)
            let other = try f.engine.copyOperation(
                src, CopyOverrides(queue: "b", queuePriority: .veryHigh, dependencies: [], notBefore: .some(nil)))
            #expect(other.queue == "b" && other.queuePriority == .veryHigh && other.dependencies == [] && other.options.notBefore == nil)
            #expect(other.state == .ready)
        }

        @Test("copy refuses what create refuses and changes nothing: unknown source, queue or dependency, a barrier, limits")
        func copyRefusals() throws {
            let f = Fixture(configuration: EngineConfiguration(maxUnfinishedPerQueue: 3))
            try f.queue("q", suspended: true)
            let src = try f.add("q")
            let barrier = try f.engine.addBarrier(to: "q").id
            var before = try f.engine.operations(in: "q", limit: 100).operations
            #expect(throws: EngineError.operationNotFound(OperationID(raw: 999).description)) { try f.engine.copyOperation(OperationID(raw: 999)) }
            #expect(throws: EngineError.queueNotFound("nope")) { try f.engine.copyOperation(src, CopyOverrides(queue: "nope")) }
            #expect(throws: EngineError.operationNotFound(OperationID(raw: 777).description)) {
                try f.engine.copyOperation(src, CopyOverrides(dependencies: [OperationID(raw: 777)]))
            }
            #expect(throws: EngineError.self) { try f.engine.copyOperation(barrier) }
            #expect(try f.engine.operations(in: "q", limit: 100).operations == before)
            // Three unfinished operations, the queue's limit.
            _ = try f.add("q")
            before = try f.engine.operations(in: "q", limit: 100).operations
            do {
                try f.engine.copyOperation(src)
                Issue.record("a copy past --max-unfinished-per-queue was accepted")
            } catch {
                guard case .limitReached = error else { Issue.record("\(error)"); return }
            }
            #expect(try f.engine.operations(in: "q", limit: 100).operations == before)
        }

        @Test("a copy in a queue with a barrier waits for that barrier, not for the source's old one")
        func copyAndBarriers() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            let first = try f.add("q")
            let barrier = try f.engine.addBarrier(to: "q").id
            let src = try f.add("q")
            #expect(try f.snapshot(src).dependencies == [barrier])
            f.kind.finish(first)
            f.kind.finish(src)
            #expect(try f.state(barrier) == .finished && f.kind.wasStarted(src))
            let copy = try f.engine.copyOperation(src)
            #expect(copy.dependencies == [], "the finished barrier it waited for is not a dependency of the copy")
            #expect(copy.state == .executing)
        }

        // MARK: - bulk cancel

        @Test("bulk cancel by state, kind and name prefix cancels exactly the unfinished matches, as cancel() would")
        func bulkCancelFilters() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            let running = try f.add("q", name: "run-1")
            let readyA = try f.add("q", name: "img-1")
            let readyB = try f.add("q", name: "doc-1")
            let pending = try f.add("q", name: "img-2", after: [readyB])
            let paused = try f.add("q", name: "img-3")
            try f.engine.pause(paused)
            let other = try f.engine.addOperationID(to: "q", OperationRequest(kind: "immediate", name: "img-4"))
            let done = try f.add("q", name: "img-5")
            try f.engine.cancel(done)

            #expect(try f.engine.cancelOperations(in: "q", matching: OperationFilter(state: .pending)) == 1)
            #expect(try f.snapshot(pending).outcome == .cancelled)
            #expect(try f.engine.cancelOperations(in: "q", matching: OperationFilter(kind: "immediate")) == 1)
            #expect(try f.snapshot(other).outcome == .cancelled)
            #expect(try f.engine.cancelOperations(in: "q", matching: OperationFilter(namePrefix: "img-")) == 2, "img-1 and the paused img-3")
            #expect(try f.snapshot(readyA).outcome == .cancelled && f.kind.wasStarted(readyA) == false)
            #expect(try f.snapshot(paused).outcome == .cancelled)
            #expect(try f.snapshot(readyB).state == .ready)
            #expect(try f.snapshot(running).state == .executing)
            #expect(try f.engine.cancelOperations(in: "q", matching: OperationFilter(state: .finished)) == 0)

            // All of them: the executing one is asked to stop and finishes once its kind has.
            #expect(try f.engine.cancelOperations(in: "q", matching: OperationFilter()) == 2)
            let r = try f.snapshot(running)
            #expect(r.state == .executing && r.isCancelled)
            #expect(f.kind.calls(.cancel, for: running).count == 1)
            #expect(try f.engine.cancelOperations(in: "q", matching: OperationFilter()) == 0, "winding down: not cancelled (or counted) twice")
            #expect(f.kind.calls(.cancel, for: running).count == 1)
            #expect(!f.kind.wasStarted(readyB), "a cancelled queued operation never runs, even when a slot frees")
            f.kind.finish(running)
            #expect(try f.snapshot(running).outcome == .cancelled)
            #expect(!f.kind.wasStarted(readyB))
            #expect(try f.engine.cancelOperations(in: "q", matching: OperationFilter()) == 0)
            #expect(throws: EngineError.queueNotFound("nope")) { try f.engine.cancelOperations(in: "nope", matching: OperationFilter()) }
        }

        @Test("bulk cancel judges the states as they were asked, and dependents outside the set still run")
        func bulkCancelChain() throws {
            let f = Fixture()
            try f.queue("q", suspended: true)
            try f.queue("o")
            let a = try f.add("q", name: "c-a")
            let b = try f.add("q", name: "c-b", after: [a])
            let c = try f.add("q", name: "c-c", after: [b])
            let outside = try f.add("o", name: "x", after: [b])
            let log = EventLog(f.engine)
            #expect(try f.engine.cancelOperations(in: "q", matching: OperationFilter(state: .pending)) == 2, "b and c, not a")
            #expect(try f.state(a) == .ready)
            #expect(try f.snapshot(b).outcome == .cancelled && (try f.snapshot(c).outcome) == .cancelled)
            #expect(try f.state(outside) == .executing, "b finished cancelled: its dependent in another queue runs")
            #expect(!log.of(c).contains { $0.key == .isReady && $0.new == .bool(true) }, "c never became ready on the way")
        }

        @Test("bulk cancel against Foundation: cancel() on each matching operation gives the same starts and outcomes")
        func bulkCancelLikeFoundation() throws {
            // Cancelled queued operations have no dependents here: Foundation releases those
            // only once the queue gives the cancelled one a slot (FoundationDifferenceTests).
            let steps: [Step] = [
                .queue("Q", max: 1), .queue("R", max: 2),
                .add("k-run", to: "Q"), .add("k-1", to: "Q"), .add("m-1", to: "Q"), .add("k-2", to: "Q", after: ["m-1"]),
                .add("r-1", to: "R", after: ["m-1"]),
                .cancelMatching("Q", prefix: "k-"),
                .finish("k-run"), .finish("m-1"), .finish("r-1"),
            ]
            let (engine, _) = try expectSameAsFoundation(steps)
            #expect(engine.outcomes["k-1"] == Outcome(ran: false, cancelled: true, finished: true))
            #expect(engine.outcomes["k-2"] == Outcome(ran: false, cancelled: true, finished: true))
            #expect(engine.outcomes["k-run"] == Outcome(ran: true, cancelled: true, finished: true))
            #expect(engine.outcomes["m-1"] == Outcome(ran: true, cancelled: false, finished: true))
        }

        // Its time is measured by `opqd-bench bulk` (one pass per dependency, not quadratic).
        @Test("bulk cancel of 50,000 of 100,000 operations that all wait for one leaves exactly the others waiting for it")
        func bulkCancelFanIn() throws {
            let f = Fixture()
            try f.queue("q")
            try f.queue("big", suspended: true)
            let root = try f.add("q")
            for i in 0..<100_000 { _ = try f.add("big", name: i % 2 == 0 ? "even" : "odd", after: [root]) }
            #expect(try f.engine.cancelOperations(in: "big", matching: OperationFilter(namePrefix: "even")) == 50_000)
            #expect(try f.engine.queue(named: "big").counts[.pending] == 50_000)
            f.kind.finish(root)
            #expect(try f.engine.queue(named: "big").counts[.ready] == 50_000)
        }

        @Test("cancelAllOperations of 50,000 operations waiting for one that 50,000 others also wait for is one pass")
        func cancelAllFanIn() throws {
            let f = Fixture()
            try f.queue("q")
            try f.queue("others", suspended: true)
            try f.queue("big", suspended: true)
            let root = try f.add("q")
            for _ in 0..<50_000 { _ = try f.add("others", after: [root]) }
            for _ in 0..<50_000 { _ = try f.add("big", after: [root]) }
            let started = ContinuousClock.now
            let q = try f.engine.cancelAll("big")
            // One at a time, each removal scanned past the 50,000 others in the root's
            // dependents: over a minute in a debug build.
            #expect(ContinuousClock.now - started < .seconds(20))
            #expect(q.operationCount == 0 && q.counts[.finished] == 50_000)
            f.kind.finish(root)
            #expect(try f.engine.operation(root).outcome == .succeeded)
            #expect(try f.engine.queue(named: "others").counts[.ready] == 50_000)
        }

        // MARK: - waitUntilFinished

        @Test("onFinished fires once when the operation finishes, at once when it has, and not after its wait is cancelled")
        func onFinished() throws {
            let f = Fixture()
            try f.queue("q")
            let a = try f.add("q")
            let b = try f.add("q")
            let fired = Locked<[String]>([])
            let ta = try f.engine.onFinished(a) { fired.withLock { $0.append("a") } }
            let tb = try #require(try f.engine.onFinished(b) { fired.withLock { $0.append("b") } })
            #expect(ta != nil && fired.value.isEmpty)
            f.engine.cancelFinishWait(tb, of: b)
            f.kind.finish(a)
            f.kind.finish(b)
            #expect(waitUntil { fired.value == ["a"] })
            #expect(try f.engine.onFinished(a) { fired.withLock { $0.append("a again") } } == nil)
            #expect(fired.value == ["a", "a again"])
            #expect(throws: EngineError.operationNotFound(OperationID(raw: 99).description)) { try f.engine.onFinished(OperationID(raw: 99)) {} }
        }

        @Test("waitUntilFinished as Foundation has it: the waiter returns once the operation is finished, cancelled or not")
        func waitLikeFoundation() throws {
            // Foundation: waitUntilFinished() of a cancelled queued operation returns once the
            // queue has let it finish.
            let queue = OperationQueue()
            queue.maxConcurrentOperationCount = 1
            let gate = DispatchSemaphore(value: 0)
            let first = BlockOperation { gate.wait() }
            let second = BlockOperation {}
            queue.addOperations([first, second], waitUntilFinished: false)
            second.cancel()
            gate.signal()
            second.waitUntilFinished()
            #expect(second.isFinished && second.isCancelled)
            queue.waitUntilAllOperationsAreFinished()

            let f = Fixture()
            try f.queue("q", max: 1)
            let a = try f.add("q")
            let b = try f.add("q")
            let fired = Locked(false)
            _ = try f.engine.onFinished(b) { fired.withLock { $0 = true } }
            try f.engine.cancel(b)
            #expect(waitUntil { fired.value })
            let s = try f.snapshot(b)
            #expect(s.isFinished && s.isCancelled)
            f.kind.finish(a)
        }

        // MARK: - filtered listing

        @Test("a filtered listing pages correctly and a rare match never scans more than the budget per page")
        func filteredPaging() throws {
            let f = Fixture()
            try f.queue("q", suspended: true)
            var rare: [OperationID] = []
            for i in 0..<5_000 {
                let id = try f.add("q", name: i % 700 == 0 ? "rare-\(i)" : "job-\(i)")
                if i % 700 == 0 { rare.append(id) }
            }
            let filter = OperationFilter(namePrefix: "rare-")
            var seen: [OperationID] = []
            var after: OperationID? = nil
            var pages = 0
            repeat {
                let page = try f.engine.operations(in: "q", matching: filter, after: after, limit: 2, scanLimit: 1_000)
                #expect(page.operations.allSatisfy { $0.name?.hasPrefix("rare-") == true })
                seen += page.operations.map(\.id)
                after = page.next
                pages += 1
            } while after != nil && pages < 100
            #expect(seen == rare, "every match once, in order")
            #expect(pages >= 5, "a 1,000-operation scan budget over 5,000 operations takes at least 5 pages; took \(pages)")
            // Without a filter a page is as before: full pages, `next` only when more follow.
            let all = try f.engine.operations(in: "q", matching: OperationFilter(), limit: 1000, scanLimit: 10)
            #expect(all.operations.count == 1000 && all.next == all.operations.last?.id)
            let kind = try f.engine.operations(in: "q", matching: OperationFilter(kind: "immediate"), limit: 10, scanLimit: 10_000)
            #expect(kind.operations.isEmpty && kind.next == nil, "the whole queue fits the budget: no match, no next")
        }
    }
}
