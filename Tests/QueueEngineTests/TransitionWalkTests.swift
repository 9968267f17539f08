import QueueEngine
import Testing

extension Engine {
    /// The engine's state changes only through its transition table (`OpRecord.state` has a
    /// private setter that only the table-applying `take` uses). These walks check the other
    /// half from outside: every state an observer sees an operation move through is a move of
    /// API.md's lifecycle (`expectedMove`, written independently of the engine), and the
    /// queue's counts always match its operations' states.
    @Suite("Every state change is a move of the table")
    struct TransitionWalkTests {
        @Test("random walks of adds, pauses, resumes, cancels, updates, finishes, failures and timers", arguments: [1, 2, 3, 4] as [UInt64])
        func randomWalk(seed: UInt64) throws {
            var rng = SplitMix(state: seed)
            let f = Fixture()
            try f.queue("q", max: 2)
            let log = EventLog(f.engine)
            var ids: [OperationID] = []
            for _ in 0..<400 {
                switch Int.random(in: 0..<10, using: &rng) {
                case 0, 1:
                    let deps = ids.isEmpty ? [] : (0..<Int.random(in: 0...2, using: &rng)).compactMap { _ in ids.randomElement(using: &rng) }
                    let notBefore = Bool.random(using: &rng) ? f.clock.now().adding(seconds: Double.random(in: 0...2, using: &rng)) : nil
                    let timeout = Bool.random(using: &rng) ? Double.random(in: 0.1...3, using: &rng) : nil
                    let retry = Bool.random(using: &rng) ? RetryPolicy(maxAttempts: 3, backoff: 0.5, multiplier: 2) : nil
                    let options = OperationOptions(timeout: timeout, retry: retry, notBefore: notBefore)
                    ids.append(try f.engine.addOperationID(to: "q", OperationRequest(kind: "manual", dependencies: deps, options: options)))
                case 2: if let id = ids.randomElement(using: &rng) { _ = try? f.engine.pause(id) }
                case 3: if let id = ids.randomElement(using: &rng) { _ = try? f.engine.resume(id) }
                case 4: if let id = ids.randomElement(using: &rng) { _ = try? f.engine.cancel(id, cascade: Bool.random(using: &rng)) }
                case 5:
                    if let id = ids.randomElement(using: &rng), let dep = ids.randomElement(using: &rng) {
                        _ = try? f.engine.update(id, dependencies: [dep])
                    }
                case 6, 7:
                    if let id = ids.randomElement(using: &rng), f.kind.wasStarted(id) {
                        f.kind.finish(id, Bool.random(using: &rng) ? .succeeded(.null) : .failed(type: "x", detail: "y"))
                    }
                default:
                    f.clock.advance(seconds: Double.random(in: 0...1, using: &rng))
                }
                let q = try f.engine.queue(named: "q")
                let (all, _) = try f.engine.operations(in: "q", limit: 10_000)
                for state in OperationState.allCases {
                    #expect(q.counts[state, default: 0] == all.filter { $0.state == state }.count, "count of \(state)")
                }
            }
            var moves = 0
            for id in ids {
                var path: [OperationState] = []
                for e in log.of(id) where path.last != e.state { path.append(e.state) }
                #expect(path.first == .pending || path.first == .ready, "\(id) was created \(path.first.map { "\($0)" } ?? "unseen")")
                #expect(path.last == (try f.state(id)), "\(id): the last reported state is its state")
                for (from, to) in zip(path, path.dropFirst()) {
                    let isMove = OperationAction.allCases.contains { action in
                        [true, false].contains { expectedMove(from, action, dependenciesMet: $0)?.0 == to }
                    }
                    #expect(isMove, "\(id) went from \(from) to \(to), which no action of the lifecycle does")
                    moves += 1
                }
            }
            #expect(moves > 80, "the walk made enough moves to mean something (\(moves))")
        }
    }
}
