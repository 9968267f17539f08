import Dispatch
import QueueEngine
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension Engine {
    @Suite("Observers")
    struct ObserverTests {
        /// Drives a little of everything: creates, starts, pauses, resumes, cancels, finishes,
        /// priority and progress changes.
        /// Drives a little of everything: creates, starts, pauses, resumes, cancels, finishes,
        /// priority and progress changes, a barrier. Five operations finish.
        private func churn(_ f: Fixture) throws {
            try f.queue("q", max: 1)
            try f.queue("r", max: 2)
            let a = try f.add("q"), b = try f.add("q"), c = try f.add("r", after: [a])
            let d = try f.add("r", priority: .low)
            try f.engine.update(b, queuePriority: .high)
            f.kind.calls(.start, for: a).last?.progress(completed: 1, total: 2)
            try f.engine.cancel(b)
            try f.engine.pause(a)
            try f.engine.resume(a)
            f.kind.finish(a)
            f.kind.finish(c, .failed(type: "boom", detail: "it broke"))
            try f.engine.cancel(d)
            f.kind.finish(d)
            try f.engine.addBarrier(to: "r")
            #expect(try [a, b, c, d].map(f.state) == [.finished, .finished, .finished, .finished])
        }

        @Test("a global observer gets every change exactly once with strictly increasing seq")
        func globalObserver() throws {
            let f = Fixture()
            let log = EventLog(f.engine)
            try churn(f)
            let events = log.all
            #expect(events.count > 20)
            let seqs = events.map(\.seq)
            #expect(seqs == Array(seqs.first!..<(seqs.first! + UInt64(seqs.count))), "no gaps, no repeats, in order")
            #expect(seqs.first == 1)
            #expect(f.engine.nextSequence == seqs.last! + 1, "nothing left undelivered")
            // Every operation that finished reported isFinished exactly once.
            let finished = Dictionary(grouping: events.filter { $0.key == .isFinished }, by: \.operation)
            #expect(finished.values.allSatisfy { $0.count == 1 })
            #expect(finished.count == 5)
        }

        @Test("the events of one operation: created ready, started, finished")
        func lifecycleEvents() throws {
            let f = Fixture()
            let log = EventLog(f.engine)
            try f.queue("q", suspended: true)
            let a = try f.add("q")
            #expect(log.of(a).map(describe) == ["isReady: none->true"])
            try f.engine.resumeQueue("q")
            f.kind.finish(a)
            #expect(
                log.of(a).map(describe) == [
                    "isReady: none->true",
                    "isReady: true->false", "isExecuting: false->true",
                    "isExecuting: true->false", "isFinished: false->true",
                ])
            #expect(log.of(a).map(\.state) == [.ready, .executing, .executing, .finished, .finished])
            #expect(log.of(a).allSatisfy { $0.queue == "q" })
        }

        @Test("an operation created with unfinished dependencies is reported as not ready, then ready")
        func pendingEvents() throws {
            let f = Fixture()
            let log = EventLog(f.engine)
            try f.queue("q", max: 1)
            let a = try f.add("q")
            let b = try f.add("q", after: [a])
            #expect(log.of(b).map(describe) == ["isReady: none->false"])
            try f.engine.suspend("q")
            f.kind.finish(a)
            #expect(log.of(b).map(describe) == ["isReady: none->false", "isReady: false->true"])
        }

        @Test("pause and resume of an executing operation are reported with isPaused")
        func pauseEvents() throws {
            let f = Fixture()
            try f.queue("q")
            let a = try f.add("q")
            let log = EventLog(f.engine)
            try f.engine.pause(a)
            try f.engine.resume(a)
            #expect(
                log.of(a).map(describe) == [
                    "isExecuting: true->false", "isPaused: false->true",
                    "isPaused: true->false", "isReady: false->true",
                    "isReady: true->false", "isExecuting: false->true",
                ])
        }

        @Test("cancelling an executing operation reports isCancelled, then isFinished when it stops")
        func cancelExecutingEvents() throws {
            let f = Fixture()
            try f.queue("q")
            let a = try f.add("q")
            let log = EventLog(f.engine)
            try f.engine.cancel(a)
            f.kind.finish(a)
            #expect(log.of(a).map(describe) == ["isCancelled: false->true", "isExecuting: true->false", "isFinished: false->true"])
        }

        @Test(
            "cancelling an operation that has not started reports isCancelled as well as isFinished",
            arguments: [OperationState.pending, .ready, .paused])
        func cancelQueuedEvents(state: OperationState) throws {
            let f = Fixture()
            try f.queue("x")
            try f.queue("q", suspended: true)
            let x = try f.add("x")
            let a = try f.add("q", after: state == .pending ? [x] : [])
            if state == .paused { try f.engine.pause(a) }
            #expect(try f.state(a) == state)
            let log = EventLog(f.engine)
            try f.engine.cancel(a)
            let keys = log.of(a).map(describe)
            #expect(keys.contains("isCancelled: false->true"), "Foundation reports the cancel (KVO isCancelled); got \(keys)")
            #expect(keys.last == "isFinished: false->true")
        }

        @Test("progress reports become progress changes")
        func progressEvents() throws {
            let f = Fixture()
            try f.queue("q")
            let a = try f.add("q")
            let log = EventLog(f.engine)
            let ctx = try #require(f.kind.calls(.start, for: a).first)
            ctx.progress(completed: 1, total: 4)
            ctx.progress(completed: 1, total: 4)  // unchanged: no event
            ctx.progress(completed: 4, total: 4)
            #expect(log.of(a).map(describe) == ["progress: none->1.0/4.0", "progress: 1.0/4.0->4.0/4.0"])
            #expect(try f.snapshot(a).progress?.fractionCompleted == 1)
        }

        @Test("an operation's observer with a key filter gets only those keys of that operation")
        func perOperationObserver() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            let a = try f.add("q"), b = try f.add("q")
            let seen = Locked<[ChangeEvent]>([])
            _ = f.engine.observe(b, keys: [.isExecuting, .isCancelled]) { e in seen.withLock { $0.append(e) } }
            let all = Locked<[ChangeEvent]>([])
            _ = f.engine.observe(b) { e in all.withLock { $0.append(e) } }
            f.kind.finish(a)
            try f.engine.cancel(b)
            f.kind.finish(b)
            #expect(seen.value.allSatisfy { $0.operation == b })
            #expect(seen.value.map(describe) == ["isExecuting: false->true", "isCancelled: false->true", "isExecuting: true->false"])
            #expect(
                all.value.map(describe) == [
                    "isReady: true->false", "isExecuting: false->true", "isCancelled: false->true",
                    "isExecuting: true->false", "isFinished: false->true",
                ])
        }

        @Test("a removed observer hears nothing more")
        func removeObserver() throws {
            let f = Fixture()
            try f.queue("q")
            let count = Locked(0)
            let token = f.engine.observeAll { batch in count.withLock { $0 += batch.count } }
            _ = try f.add("q")
            let before = count.value
            #expect(before > 0)
            f.engine.removeObserver(token)
            _ = try f.add("q")
            #expect(count.value == before)
        }

        @Test("observers are called outside the engine's lock: an observer may call back into the engine")
        func reentrantObserver() throws {
            let f = Fixture()
            try f.queue("q")
            try f.queue("side")
            let engine = f.engine
            let reads = Locked<[OperationState]>([])
            let added = Locked(0)
            _ = engine.observeAll { batch in
                for e in batch {
                    if let s = try? engine.operation(e.operation) { reads.withLock { $0.append(s.state) } }
                }
                // A change from inside an observer, once.
                if added.withLock({ n in
                    n += 1; return n
                }) == 1 {
                    _ = try? engine.addOperationID(to: "side", OperationRequest(kind: "immediate"))
                }
            }
            let done = DispatchSemaphore(value: 0)
            DispatchQueue.global().async {
                let a = try? f.add("q")
                if let a { f.kind.finish(a) }
                done.signal()
            }
            #expect(done.wait(timeout: .now() + 5) == .success, "an observer calling the engine deadlocked it")
            #expect(reads.value.count >= 5)
            #expect(try engine.queue(named: "side").counts[.finished] == 1)
        }

        @Test("a slow observer does not hold up engine calls on other threads")
        func slowObserver() throws {
            let f = Fixture()
            try f.queue("q", suspended: true)
            let slow = Locked(false)
            let sleeping = DispatchSemaphore(value: 0)
            let delivered = Locked(0)
            _ = f.engine.observeAll { batch in
                delivered.withLock { $0 += batch.count }
                if slow.value {
                    sleeping.signal()
                    usleep(50_000)
                }
            }
            slow.withLock { $0 = true }
            let background = DispatchSemaphore(value: 0)
            DispatchQueue.global().async {
                _ = try? f.add("q")  // this thread delivers the batch and sleeps in the observer
                background.signal()
            }
            #expect(sleeping.wait(timeout: .now() + 2) == .success)
            var slowest = 0.0
            for _ in 0..<3 {
                let t0 = monotonicMillis()
                _ = try f.add("q")
                _ = try f.engine.queue(named: "q")
                slowest = max(slowest, monotonicMillis() - t0)
            }
            #expect(slowest < 40, "engine calls took \(slowest) ms while an observer slept 50 ms per batch")
            slow.withLock { $0 = false }
            #expect(background.wait(timeout: .now() + 2) == .success)
            #expect(waitUntil { delivered.value == 4 }, "every change still reaches the observer")
        }
    }
}
