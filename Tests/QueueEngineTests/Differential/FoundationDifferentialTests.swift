import QueueEngine
import Testing

extension Engine {
    @Suite("Same as Foundation's OperationQueue")
    struct FoundationDifferentialTests {
        @Test("a serial queue filled while suspended starts by priority, then in the order added")
        func priorityOrder() throws {
            let priorities: [QueuePriority] = [
                .normal, .low, .high, .veryHigh, .normal, .veryLow,
                .high, .low, .veryHigh, .normal, .veryLow, .high,
            ]
            var steps: [Step] = [.queue("S", max: 1, suspended: true)]
            for (i, p) in priorities.enumerated() { steps.append(.add("p\(i)", to: "S", priority: p, held: false)) }
            steps.append(.resume("S"))
            let (engine, _) = try expectSameAsFoundation(steps)
            // And it is API.md's rule, stated outright.
            #expect(engine.order == ["p3", "p8", "p2", "p6", "p11", "p0", "p4", "p9", "p1", "p7", "p5", "p10"])
        }

        @Test("changing the priority of queued operations changes the order they start in")
        func priorityChange() throws {
            let (engine, _) = try expectSameAsFoundation([
                .queue("S", max: 1, suspended: true),
                .add("x0", to: "S", held: false), .add("x1", to: "S", held: false), .add("x2", to: "S", held: false),
                .add("x3", to: "S", held: false), .add("x4", to: "S", priority: .low, held: false),
                .priority("x3", .veryHigh), .priority("x0", .veryLow), .priority("x4", .high),
                .resume("S"),
            ])
            #expect(engine.order == ["x3", "x4", "x1", "x2", "x0"])
        }

        @Test("dependencies across queues hold operations back until they finish")
        func crossQueueDependencies() throws {
            let (engine, _) = try expectSameAsFoundation([
                .queue("A", max: 1), .queue("B", max: 1), .queue("C", max: 2),
                .add("a1", to: "A"), .add("a2", to: "A"),
                .add("b1", to: "B", after: ["a2"]), .add("b2", to: "B", after: ["a1"]),
                .add("c1", to: "C", after: ["b1", "a1"]), .add("c2", to: "C"), .add("c3", to: "C", after: ["b2"]),
                .finish("a1"), .finish("b2"), .finish("a2"), .finish("b1"), .finish("c2"), .finish("c3"), .finish("c1"),
            ])
            #expect(engine.steps[10] == ["A:a2", "B:b2"], "finishing a1 frees a2 and b2")
            #expect(engine.steps[13] == [], "c1 is ready but C is full")
            #expect(engine.steps[14] == ["C:c1"])
        }

        @Test("suspending a queue lets the running operations finish and starts nothing until resumed")
        func suspendWhileRunning() throws {
            let (engine, _) = try expectSameAsFoundation([
                .queue("Q", max: 2),
                .add("x1", to: "Q"), .add("x2", to: "Q"), .add("x3", to: "Q"), .add("x4", to: "Q"),
                .suspend("Q"),
                .finish("x1"), .finish("x2"), .add("x5", to: "Q"),
                .resume("Q"),
                .finish("x3"), .finish("x4"), .finish("x5"),
            ])
            #expect(engine.steps[7] == [], "nothing starts while suspended")
            #expect(engine.steps[9] == ["Q:x3", "Q:x4"])
        }

        @Test("a cancelled pending operation does not run and its dependents still do")
        func cancelPending() throws {
            let (engine, _) = try expectSameAsFoundation([
                // d1 and d2 on different queues: when two operations of one serial queue become ready
                // at the same moment, corelibs-foundation starts them in no fixed order.
                .queue("X", max: 1), .queue("A", max: 1), .queue("B", max: 1), .queue("C", max: 1),
                .add("x", to: "X"), .add("p", to: "A", after: ["x"]),
                .add("d1", to: "B", after: ["p"]), .add("d2", to: "C", after: ["p"]),
                .cancel("p"),
                .finish("d1"), .finish("d2"), .finish("x"),
            ])
            #expect(engine.outcomes["p"] == Outcome(ran: false, cancelled: true, finished: true))
            #expect(engine.outcomes["d1"] == Outcome(ran: true, cancelled: false, finished: true))
            #expect(engine.steps[8] == ["B:d1", "C:d2"], "both dependents start when p is cancelled")
        }

        @Test("cancelAll cancels the queued operations, and the running one runs on cancelled")
        func cancelAll() throws {
            let (engine, _) = try expectSameAsFoundation([
                .queue("Q", max: 1),
                .add("q1", to: "Q"), .add("q2", to: "Q"), .add("q3", to: "Q", after: ["q2"]), .add("q4", to: "Q", priority: .high),
                .cancelAll("Q"),
                .add("q5", to: "Q"),
                .finish("q1"), .finish("q5"),
            ])
            #expect(engine.outcomes["q1"] == Outcome(ran: true, cancelled: true, finished: true))
            for name in ["q2", "q3", "q4"] { #expect(engine.outcomes[name] == Outcome(ran: false, cancelled: true, finished: true)) }
            #expect(engine.outcomes["q5"] == Outcome(ran: true, cancelled: false, finished: true))
        }

        @Test("a queue limited to 2 never runs more than 2 and starts six operations in the same order")
        func concurrencyLimit() throws {
            let (engine, _) = try expectSameAsFoundation([
                .queue("Q", max: 2),
                .add("o1", to: "Q"), .add("o2", to: "Q"), .add("o3", to: "Q", priority: .low),
                .add("o4", to: "Q", priority: .high), .add("o5", to: "Q", priority: .veryHigh), .add("o6", to: "Q"),
                .finish("o1"), .finish("o2"), .finish("o5"), .finish("o4"), .finish("o6"), .finish("o3"),
            ])
            #expect(engine.maxRunning["Q"] == 2)
            #expect(engine.order == ["o1", "o2", "o5", "o4", "o6", "o3"])
        }

        @Test("a barrier waits for the operations added before it, and those added after it wait for the barrier")
        func barrier() throws {
            let steps: [Step] = [
                .queue("Q", max: 2),
                .add("g1", to: "Q"), .add("g2", to: "Q"),
                .barrier("B", to: "Q"),
                .add("g3", to: "Q"), .add("g4", to: "Q"),
                .finish("g1"), .finish("g2"), .finish("g3"), .finish("g4"),
            ]
            let (engine, foundation) = try expectSameAsFoundation(steps)
            for trace in [engine, foundation] {
                let b = try #require(trace.index(of: "B"))
                #expect(trace.index(of: "g2")! < b)
                #expect(b < trace.index(of: "g3")! && b < trace.index(of: "g4")!)
            }
            #expect(engine.steps[7] == ["Q:B", "Q:g3", "Q:g4"], "the barrier runs as soon as g2 finishes")
        }

        @Test("a barrier on an idle queue runs at once")
        func barrierOnIdleQueue() throws {
            try expectSameAsFoundation([
                .queue("Q", max: 2),
                .barrier("B", to: "Q"),
                .add("g1", to: "Q"),
                .finish("g1"),
            ])
        }
    }
}

extension Engine {
    /// Where the engine knowingly differs from corelibs-foundation, following API.md; outcomes
    /// agree, only timing or order differ. Both sides are pinned, so a change on either shows.
    /// - Foundation finishes a cancelled queued operation only when its queue gives it a slot
    ///   (it is "started" and ends at once), so on a busy queue its dependents elsewhere wait
    ///   for that slot. API.md: cancelling an operation that has not started finishes it; the
    ///   engine does so at once.
    /// - Foundation moves an operation whose priority changes to the end of that priority's
    ///   list; API.md orders equal priorities by when they were added.
    @Suite("Differences from Foundation")
    struct FoundationDifferenceTests {
        @Test("a queued operation cancelled behind a running one releases its dependents at once")
        func cancelBehindRunning() throws {
            let steps: [Step] = [
                .queue("A", max: 1), .queue("B", max: 1),
                .add("a1", to: "A"), .add("p", to: "A"), .add("d", to: "B", after: ["p"]),
                .cancel("p"),
                .finish("a1"),
                .finish("d"),
            ]
            let (engine, hints) = try runEngine(steps)
            #expect(hints == [0, 0, 1, 1, 1, 2, 2, 2, 2])
            // Foundation is given its own expected counts, so that it is not waited for in vain.
            let foundation = runFoundation(steps, startsAfterStep: [0, 0, 1, 1, 1, 1, 2, 2, 2])
            #expect(engine.outcomes == foundation.outcomes)
            #expect(engine.steps[5] == ["B:d"], "engine: d starts when p is cancelled")
            #expect(
                foundation.steps[5] == [] && foundation.steps[6] == ["B:d"],
                "Foundation: d starts only once a1 has freed A's slot for the cancelled p\n\(sideBySide(steps, engine: engine, foundation: foundation))")
        }

        @Test("a priority changed and changed back keeps its place in the order added")
        func priorityRoundTrip() throws {
            let steps: [Step] = [
                .queue("S", max: 1, suspended: true),
                .add("x0", to: "S", held: false), .add("x1", to: "S", held: false), .add("x2", to: "S", held: false),
                .priority("x0", .low), .priority("x0", .normal),
                .resume("S"),
            ]
            let (engine, hints) = try runEngine(steps)
            let foundation = runFoundation(steps, startsAfterStep: hints)
            #expect(engine.order == ["x0", "x1", "x2"], "API.md: higher priority first, then the order they were added")
            // corelibs-foundation moves an operation to the end of its new priority's list.
            #expect(foundation.order == ["x1", "x2", "x0"])
        }
    }
}
