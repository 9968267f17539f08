import QueueEngine
import StoreKit
import Testing

/// Hosts' breakers (API.md "Hosts") are durable: an open host comes back open, with its
/// escalation and its hand setting, and breaker events keep their host and states.
extension StoreConformanceTests {
    @Test(arguments: StoreKind.durable)
    func hostsSurviveCloseAndReopen(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let open = HostSnapshot(
                host: "api.example.com:443", state: .open, consecutiveFailures: 7, openedAt: t0, until: t0.adding(seconds: 10),
                throttledUntil: t0.adding(seconds: 3), lastError: .object([("type", .string("connection-refused")), ("detail", .string("a \"quoted\" 🚀"))]),
                reopenings: 2, revision: 9)
            let manual = HostSnapshot(
                host: "[::1]:8080", state: .open, manual: HostManual(breaker: .open, until: t0.adding(seconds: 3600), reason: "maintenance"),
                revision: 3)
            let closedByHand = HostSnapshot(host: "b:80", state: .closed, manual: HostManual(breaker: .closed), revision: 1)
            var first = HostSnapshot(host: "c:81", state: .halfOpen, revision: 1)
            let store = try place.openDurable()
            store.append([.host(open), .host(first), .host(manual), .host(closedByHand)], upTo: 1)
            #expect(waitDurable(store, 1))
            // The last record of a host in one commit decides its row.
            first.state = .ramping
            first.revision = 2
            var last = first
            last.state = .closed
            last.revision = 3
            let event = ChangeEvent(
                seq: 1, time: t0, queue: "c:81", operation: OperationID(raw: 0), key: .breaker, old: .breaker(.ramping), new: .breaker(.closed),
                state: .ready)
            store.append([.host(first), .event(event), .host(last)], upTo: 2)
            #expect(waitDurable(store, 2))
            store.close()

            let reopened = try place.openDurable()
            let state = try reopened.load()
            #expect(state.hosts == [manual, open, closedByHand, last].sorted { $0.host < $1.host })
            #expect(state.lastSeq == 1)
            let events = reopened.events(of: OperationID(raw: 0), after: 0, limit: 10)
            #expect(events == [event], "a breaker event keeps its host, key and states")
        }
    }

    /// The engine on the store: an open host comes back open and holds its backlog.
    @Test(arguments: StoreKind.durable)
    func anEngineRestoresAnOpenHost(kind: StoreKind) throws {
        try StorePlace.with(kind) { place in
            let store = try place.openDurable()
            let engine = QueueEngine(kinds: ["host": HostTestKind()], store: store)
            try engine.createQueue(name: "q", maxConcurrentOperationCount: 10)
            try engine.setHost("a:80", breaker: .open, reason: "down")
            let held = try engine.addOperationID(to: "q", OperationRequest(kind: "host", spec: .object([("host", .string("a:80"))])))
            #expect(try engine.host(named: "a:80").held == 1)
            #expect(waitDurable(engine))
            store.close()

            let store2 = try place.openDurable()
            let recovered = try store2.load()
            let kind2 = HostTestKind()
            let engine2 = QueueEngine(kinds: ["host": kind2], store: store2)
            engine2.restore(recovered)
            let h = try engine2.host(named: "a:80")
            #expect(h.state == .open && h.manual?.reason == "down" && h.held == 1)
            #expect(kind2.starts == 0, "nothing is sent to a host that comes back open")
            #expect(try engine2.operation(held).state == .ready)
        }
    }
}

/// A kind that sends to the host named by its spec's `host` and never ends by itself.
final class HostTestKind: OperationKind, @unchecked Sendable {
    private let count = Locked(0)
    var starts: Int { count.value }
    func host(spec: JSONValue?) -> String? {
        if case let .string(h)? = spec?["host"] { return h }
        return nil
    }
    func start(_ context: ExecutionContext) { count.withLock { $0 += 1 } }
    func cancel(_ context: ExecutionContext) {}
    func pause(_ context: ExecutionContext) {}
}
