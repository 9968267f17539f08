import QueueEngine
import Testing

extension Engine {
    @Suite("Pause and resume")
    struct PauseResumeTests {
        @Test("a paused pending operation does not become ready when its dependency finishes, and runs once resumed")
        func pausePending() throws {
            let f = Fixture()
            try f.queue("a")
            try f.queue("b")
            let dep = try f.add("a")
            let op = try f.add("b", after: [dep])
            #expect(try f.state(op) == .pending)

            let paused = try f.engine.pause(op)
            #expect(paused.state == .paused && paused.isPaused)
            f.kind.finish(dep)
            #expect(try f.state(dep) == .finished)
            #expect(try f.state(op) == .paused)
            #expect(!f.kind.wasStarted(op))

            try f.engine.resume(op)
            #expect(try f.state(op) == .executing)
            #expect(f.kind.calls(.start, for: op).map(\.isResume) == [false])
        }

        @Test("a paused ready operation is passed over until it is resumed")
        func pauseReady() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            let a = try f.add("q"), b = try f.add("q"), c = try f.add("q")
            #expect(try f.state(b) == .ready)
            try f.engine.pause(b)

            f.kind.finish(a)
            #expect(try f.state(c) == .executing, "the slot goes to the next ready operation")
            #expect(try f.state(b) == .paused)

            let resumed = try f.engine.resume(b)
            #expect(resumed.state == .ready, "the slot is still taken by c")
            f.kind.finish(c)
            #expect(try f.state(b) == .executing)
            #expect(f.kind.started == [a, c, b])
        }

        @Test("pausing an executing operation frees its slot, holds back its dependents, and its next start is a resume")
        func pauseExecuting() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            try f.queue("r")
            let a = try f.add("q"), b = try f.add("q")
            let dependent = try f.add("r", after: [a])
            #expect(try f.state(a) == .executing)

            let paused = try f.engine.pause(a)
            #expect(paused.state == .paused)
            #expect(f.kind.calls(.pause, for: a).count == 1, "the kind is asked to hold still")
            #expect(try f.state(b) == .executing, "a paused operation does not count against the queue's limit")
            #expect(try f.engine.queue(named: "q").counts[.executing] == 1)
            #expect(try f.state(dependent) == .pending)

            #expect(try f.engine.resume(a).state == .ready)
            #expect(f.kind.calls(.start, for: a).count == 1, "no slot yet: b holds it")
            f.kind.finish(b)
            let starts = f.kind.calls(.start, for: a)
            #expect(starts.map(\.isResume) == [false, true])
            #expect(try f.state(a) == .executing)
            #expect(try f.state(dependent) == .pending, "dependents wait until the paused operation has finished")

            f.kind.finish(a)
            #expect(try f.snapshot(a).outcome == .succeeded)
            #expect(try f.state(dependent) == .executing)
        }

        @Test("time spent paused is not counted in executedSeconds")
        func executedSecondsExcludesPause() throws {
            let f = Fixture()
            try f.queue("q")
            let a = try f.add("q")
            f.clock.advance(seconds: 5)
            try f.engine.pause(a)
            f.clock.advance(seconds: 100)
            try f.engine.resume(a)
            let starts = f.kind.calls(.start, for: a)
            #expect(starts.count == 2)
            #expect(starts.first?.executedSeconds == 0)
            #expect(starts.last?.executedSeconds == 5)
            #expect(starts.last?.attempt == 1, "a resume is the same attempt")
        }

        @Test("work that ends while its operation is paused is applied on resume without starting the kind again")
        func completionWhilePaused() throws {
            let f = Fixture()
            try f.queue("q")
            let a = try f.add("q")
            try f.engine.pause(a)
            f.kind.finish(a, .succeeded(.string("done")))
            #expect(try f.state(a) == .paused)

            try f.engine.resume(a)
            let s = try f.snapshot(a)
            #expect(s.state == .finished)
            #expect(s.outcome == .succeeded)
            #expect(s.result == .string("done"))
            #expect(f.kind.calls(.start, for: a).count == 1)
        }

        @Test("a paused operation resumes to pending while a dependency is unfinished")
        func resumeToPending() throws {
            let f = Fixture()
            try f.queue("q")
            let dep = try f.add("q")
            let op = try f.add("q", after: [dep])
            try f.engine.pause(op)
            #expect(try f.engine.resume(op).state == .pending)
            f.kind.finish(dep)
            #expect(try f.state(op) == .executing)
        }

        @Test("pausing a paused or finished operation, and resuming one that is not paused, are refused")
        func invalidPauseResume() throws {
            let f = Fixture()
            try f.queue("q", max: 1)
            let running = try f.add("q"), ready = try f.add("q")
            let pending = try f.add("q", after: [running])
            #expect(throws: EngineError.invalidTransition(from: .executing, action: .resume)) { try f.engine.resume(running) }
            #expect(throws: EngineError.invalidTransition(from: .ready, action: .resume)) { try f.engine.resume(ready) }
            #expect(throws: EngineError.invalidTransition(from: .pending, action: .resume)) { try f.engine.resume(pending) }
            try f.engine.pause(ready)
            #expect(throws: EngineError.invalidTransition(from: .paused, action: .pause)) { try f.engine.pause(ready) }
            f.kind.finish(running)
            #expect(throws: EngineError.invalidTransition(from: .finished, action: .pause)) { try f.engine.pause(running) }
            #expect(throws: EngineError.invalidTransition(from: .finished, action: .resume)) { try f.engine.resume(running) }
            #expect(try f.state(ready) == .paused, "refusals change nothing")
        }

        @Test("cancelling an operation paused mid-run asks its kind to stop and finishes it cancelled")
        func cancelPausedMidRun() throws {
            let f = Fixture()
            try f.queue("q")
            let a = try f.add("q")
            try f.engine.pause(a)
            let s = try f.engine.cancel(a)
            #expect(s.state == .finished && s.outcome == .cancelled && s.isCancelled)
            #expect(f.kind.calls(.cancel, for: a).count == 1)
            f.kind.finish(a)  // a late report from the stopped work is ignored
            #expect(try f.snapshot(a).outcome == .cancelled)
        }
    }
}
