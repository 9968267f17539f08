import QueueEngine
import Testing

/// API.md "Lifecycle", written out independently of the engine's table: valid moves are
/// pending→ready, ready→pending (an unfinished dependency added), pending/ready→paused,
/// paused→pending/ready, ready→executing, executing→paused (its run held still),
/// executing→finished and pending/ready/paused→finished (cancel, marked cancelled);
/// cancelling an executing operation asks its kind to stop (it stays executing); and, from
/// API.md "Hosts", executing→ready when the host of its run asked to slow down (`hold`).
func expectedMove(_ state: OperationState, _ action: OperationAction, dependenciesMet: Bool)
    -> (OperationState, TransitionEffect)?
{
    switch (state, action) {
    case (.pending, .dependenciesMet): return (.ready, .none)
    case (.ready, .dependencyAdded): return (.pending, .none)
    case (.pending, .pause), (.ready, .pause): return (.paused, .none)
    case (.executing, .pause): return (.paused, .pauseRun)
    case (.paused, .resume): return (dependenciesMet ? .ready : .pending, .none)
    case (.ready, .start): return (.executing, .none)
    case (.executing, .complete): return (.finished, .none)
    case (.pending, .cancel), (.ready, .cancel), (.paused, .cancel): return (.finished, .markCancelled)
    case (.executing, .cancel): return (.executing, .requestStop)
    case (.executing, .hold): return (.ready, .none)
    default: return nil
    }
}

extension Engine {
    @Suite("The transition table")
    struct TransitionTableTests {
        @Test(
            "every state and action pair either makes API.md's move or is an invalid transition",
            arguments: OperationState.allCases, OperationAction.allCases)
        func everyPair(state: OperationState, action: OperationAction) {
            for met in [true, false] {
                let expected = expectedMove(state, action, dependenciesMet: met)
                do {
                    let (next, effect) = try state.applying(action, dependenciesMet: met)
                    if let expected {
                        #expect(next == expected.0, "\(state) + \(action) (dependenciesMet: \(met))")
                        #expect(effect == expected.1, "\(state) + \(action) (dependenciesMet: \(met))")
                    } else {
                        Issue.record("\(state) + \(action) (dependenciesMet: \(met)) should be refused, got \(next), \(effect)")
                    }
                } catch {
                    if let expected {
                        Issue.record("\(state) + \(action) (dependenciesMet: \(met)) should give \(expected), got \(error)")
                    } else {
                        #expect(error == .invalidTransition(from: state, action: action))
                    }
                }
            }
        }

        @Test("a finished operation accepts no action at all")
        func finishedIsTerminal() {
            for action in OperationAction.allCases {
                #expect(throws: EngineError.invalidTransition(from: .finished, action: action)) {
                    try OperationState.finished.applying(action, dependenciesMet: true)
                }
            }
        }

        @Test("the table has exactly thirteen valid (state, action) pairs")
        func validPairCount() {
            var valid = 0
            for s in OperationState.allCases {
                for a in OperationAction.allCases where (try? s.applying(a, dependenciesMet: true)) != nil { valid += 1 }
            }
            // pending: dependenciesMet, pause, cancel; ready: dependencyAdded, start, pause, cancel;
            // executing: complete, pause, cancel, hold; paused: resume, cancel.
            #expect(valid == 13)
        }
    }
}
