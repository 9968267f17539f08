import Foundation
import QueueEngine
import Synchronization

/// `opqd-bench bulk [N]`: the engine's share of a bulk cancel and of a filtered listing on a
/// queue of N operations (default 100,000), as the service runs the engine (numbered events,
/// one observer counting every change, the in-memory store). Over HTTP a bulk cancel also pays
/// for the event log, metrics and the store's commit of every change; this isolates what the
/// engine's lock is held for.
///
/// Rows: one `cancelOperations` call over all N (flat queue, and N operations that all wait for
/// one: the fan-in where removing dependents one at a time would be quadratic), the same N
/// cancelled by N `cancel` calls for comparison, and one filtered listing page whose filter
/// never matches (bounded by the 10,000-operation scan budget) vs an unbounded scan.
enum BulkBench {
    static func main(_ args: [String]) -> Int32 {
        var n = 100_000
        if let a = args.first {
            guard let v = Int(a), (1...10_000_000).contains(v) else {
                eprint("usage: opqd-bench bulk [N]   (N from 1 to 10000000, default 100000)\n")
                return 2
            }
            n = v
        }
        print("opqd-bench bulk: engine only, queue of \(n) operations, in-memory store, one observer counting changes")
        do {
            let (flat, flatEvents) = try time(n, fanIn: false) { e in try e.cancelOperations(in: "q", matching: OperationFilter()) }
            let (fan, _) = try time(n, fanIn: true) { e in try e.cancelOperations(in: "q", matching: OperationFilter(namePrefix: "job")) }
            let (one, _) = try time(n, fanIn: false) { e in
                var c = 0
                for op in try e.operations(in: "q", limit: n).operations {
                    try e.cancel(op.id)
                    c += 1
                }
                return c
            }
            print(String(format: "bulk cancel, one call, flat:      %8.1f ms  (%d changes reported)", flat * 1000, flatEvents))
            print(String(format: "bulk cancel, one call, fan-in:    %8.1f ms", fan * 1000))
            print(String(format: "one cancel call per operation:    %8.1f ms", one * 1000))

            let engine = try filled(n, fanIn: false).engine
            var t = BenchSupport.now()
            let page = try engine.operations(in: "q", matching: OperationFilter(namePrefix: "never"), limit: 100, scanLimit: 10_000)
            let bounded = BenchSupport.now() - t
            t = BenchSupport.now()
            _ = try engine.operations(in: "q", matching: OperationFilter(namePrefix: "never"), limit: 100, scanLimit: .max)
            let unbounded = BenchSupport.now() - t
            print(String(format: "listing, no match, 10k scan budget: %6.2f ms (next %@)", bounded * 1000, page.next?.description ?? "null"))
            print(String(format: "listing, no match, whole queue:     %6.2f ms", unbounded * 1000))
        } catch {
            eprint("opqd-bench bulk: \(error)\n")
            return 1
        }
        return 0
    }

    /// Builds a suspended queue of `n` operations (with `fanIn`, all waiting for one executing
    /// operation in another queue), then times `body`.
    static func time(_ n: Int, fanIn: Bool, _ body: (QueueEngine) throws -> Int) throws -> (Double, Int) {
        let (engine, counter) = try filled(n, fanIn: fanIn)
        let before = counter.value.load(ordering: .relaxed)
        let t = BenchSupport.now()
        let cancelled = try body(engine)
        let seconds = BenchSupport.now() - t
        guard cancelled == n else { throw BenchError("cancelled \(cancelled) of \(n)") }
        return (seconds, counter.value.load(ordering: .relaxed) - before)
    }

    final class Hold: OperationKind {
        func start(_ context: ExecutionContext) {}
        func cancel(_ context: ExecutionContext) { context.finish(.failed(type: "cancelled", detail: "")) }
        func pause(_ context: ExecutionContext) {}
    }

    static func filled(_ n: Int, fanIn: Bool) throws -> (engine: QueueEngine, counter: EngineBench.Counter) {
        let engine = QueueEngine(kinds: ["hold": Hold()])
        let counter = EngineBench.Counter()
        _ = engine.observeAll { batch in counter.value.add(batch.count, ordering: .relaxed) }
        try engine.createQueue(name: "root")
        try engine.createQueue(name: "q", isSuspended: true)
        let root = try engine.addOperationID(to: "root", OperationRequest(kind: "hold"))
        let request = OperationRequest(kind: "hold", name: "job", dependencies: fanIn ? [root] : [])
        for _ in 0..<n { _ = try engine.addOperationID(to: "q", request) }
        return (engine, counter)
    }

    struct BenchError: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }
}
