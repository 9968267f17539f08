import Grammar
import MicroHTTP
import QueueEngine

/// The change feed (`/v1/events`, a long poll) and its Server-Sent Events stream.
package struct EventsController: Sendable {
    package init(events: EventLog, scheduler: any EngineScheduler, limits: APILimits) {
        self.events = events
        self.scheduler = scheduler
        self.limits = limits
    }

    let events: EventLog
    /// Long polls end on it (the engine's; a manual clock in tests).
    let scheduler: any EngineScheduler
    let limits: APILimits

    package func addRoutes(to r: inout Router) {
        r.add("GET", "/v1/events", scope: .instance) { req, _ in try feed(req) }
        r.add("GET", "/v1/events/stream", scope: .instance) { req, _ in try stream(req) }
    }

    func feed(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after", "limit", "wait"])
        let after = UInt64(try q.int("after", in: 0...Int.max) ?? 0)
        let limit = try q.int("limit", in: 1...10_000) ?? 1000
        let wait = try q.seconds("wait", max: 300) ?? 0
        let (log, maxBytes) = (events, pageBudget(limits))
        @Sendable func answer() -> HTTPResponse {
            switch log.page(after: after, limit: limit, maxBytes: maxBytes) {
            case let .gone(oldest):
                return Self.expired(after: after, oldest: oldest).response
            case let .events(list, last):
                var o = JSONOut(capacity: 200 * list.count + 64)
                o.open(); o.key("events"); o.openArray()
                for e in list { o.raw(e) }
                o.closeArray()
                o.key("next"); o.int(last)
                o.close()
                return json(200, o.bytes)
            }
        }
        if wait == 0 || log.lastSeq > after { return .response(answer()) }
        return .deferred { responder in
            guard let token = log.wait(after: after, { responder.respond(answer()) }) else { return }
            // At the timeout, or at shutdown (not 503): the page now.
            LongPoll.ends(responder, after: wait, on: scheduler) {
                log.cancelWait(token)
                responder.respond(answer())
            }
        }
    }

    static func expired(after: UInt64, oldest: UInt64) -> Problem {
        // `oldest` is at least 1 whenever events were dropped.
        Problem(
            410, "cursor-expired", "Gone",
            "events after \(after) are no longer kept; the oldest kept event is \(oldest); restart from after=\(oldest &- 1)")
    }

    func stream(_ req: HTTPRequest) throws -> HTTPHandlerResult {
        let q = try Query(req, allowed: ["after"])
        var start = UInt64(try q.int("after", in: 0...Int.max) ?? 0)
        var resuming = false
        // An EventSource reconnecting sends the last id it saw: one of ours, so decimal digits.
        // An empty one is no id (the SSE spec sends none then); anything else is refused by the
        // same grammar as `after`, whether or not `after` is given (which then wins), rather
        // than taken as 0 and replaying the whole feed.
        if let last = req.header("last-event-id"), !last.isEmpty {
            switch DecimalNumber.integer(last, in: 0...Int.max) {
            case let .success(n):
                if q.values["after"] == nil { (start, resuming) = (UInt64(n), true) }
            case let .failure(why):
                throw Query.refused("Last-Event-ID", last, why, "the id of an event, from 0 to \(Int.max) as `after`", DecimalNumber.integerRule)
            }
        }
        let (after, log, resumed) = (start, events, resuming)
        // `oldestKept` is at least 1; `after + 1` would overflow for a client-given UInt64.max.
        if after < log.oldestKept - 1 && log.lastSeq > 0 { throw Self.expired(after: after, oldest: log.oldestKept) }
        return .stream(status: 200, headers: [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("Connection", "close")]) { stream in
            if !log.subscribe(stream, after: after, resuming: resumed) { stream.close() }
        }
    }
}
