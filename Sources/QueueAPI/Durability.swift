import Locking
import MicroHTTP
import QueueEngine
import QueueStore

#if canImport(Glibc)
import Glibc
#endif

/// Every 2xx to a change is durable: answers wait for the commit that holds the change, and a
/// create with an `Idempotency-Key` keeps its answer (durably too) for a repeat.
struct Durability: Sendable {
    let engine: QueueEngine
    let idempotency: IdempotencyCache
    let store: any ServiceStore
    /// Seconds an idempotency key is kept (`--retain`).
    let retain: Double

    /// Answers a change only once it is durable.
    func ack(_ response: HTTPResponse) -> HTTPHandlerResult {
        guard store.isDurable else { return .response(response) }
        let engine = self.engine
        return .deferred { responder in
            // The change is made: at shutdown this answer is waited for, never replaced by a 503.
            responder.answerBeforeShutdown()
            engine.whenDurable { responder.respond(response) }
        }
    }

    /// `ack`, also waiting for `other` (another write that must be durable before the answer,
    /// started when the answer is deferred) to call back.
    func ack(_ response: HTTPResponse, alsoAfter other: @escaping @Sendable (_ done: @escaping @Sendable () -> Void) -> Void) -> HTTPHandlerResult {
        let (engine, durable) = (self.engine, store.isDurable)
        return .deferred { responder in
            responder.answerBeforeShutdown()
            other {
                if durable { engine.whenDurable { responder.respond(response) } } else { responder.respond(response) }
            }
        }
    }

    /// A create: answered once durable; with an `Idempotency-Key`, a repeat gets the first
    /// answer instead of creating a second resource.
    func idempotent(_ req: HTTPRequest, _ body: () throws -> HTTPResponse) throws -> HTTPHandlerResult {
        guard let key = req.header("idempotency-key") else { return ack(try body()) }
        guard !key.isEmpty, key.utf8.count <= 255 else {
            throw Problem.invalid("Idempotency-Key", "must be 1 to 255 characters")
        }
        let scope = req.path + "\u{0}" + key
        let bodyHash = IdempotencyCache.hash(req.body)
        switch idempotency.begin(scope, hash: bodyHash, now: SystemClock().now(), retain: retain) {
        case let .full(problem):
            throw problem
        case let .replay(response):
            var r = response
            r.headers.append(("Idempotent-Replayed", "true"))
            return .response(r)
        case .inProgress:
            throw Problem(409, "idempotency-in-progress", "Request in progress", "a request with this Idempotency-Key is still being processed; retry shortly")
        case .mismatch:
            throw Problem.invalid("Idempotency-Key", "was already used with a different request body")
        case .new:
            // The next commit waits (briefly) until the change and its kept answer are both
            // handed to the writer, so they share one transaction (below).
            let writer = self.store
            writer.holdCommits()
            var held = true
            func release() {
                if held { writer.releaseCommits(); held = false }
            }
            defer { release() }
            let response: HTTPResponse
            do {
                response = try body()
            } catch let error as any ProblemConvertible {
                // A refusal is an answer too: a repeat with the same key gets the same refusal.
                response = error.problem.response
            } catch {
                idempotency.abandon(scope)
                throw error
            }
            // A refusal that may pass (429, 5xx) is not kept: a retry with the same key gets a new try.
            if response.status == 429 || response.status >= 500 {
                idempotency.abandon(scope)
                return .response(response)
            }
            let (cache, engine, store) = (idempotency, engine, store)
            guard store.isDurable else {
                cache.finish(scope, response: response)
                return .response(response)
            }
            let record = IdempotencyRecord(
                scope: scope, bodyHash: bodyHash, status: response.status,
                headers: response.headers, body: response.body, createdAt: SystemClock().now())
            // Until the change and the kept answer are committed, a retry gets 409 in-progress,
            // never a replay of an answer a crash could still take back.
            //
            // The kept answer goes to the writer right behind the change when the change is
            // already in the writer's queue, while the next commit is held: the writer commits
            // in order, so both land in one transaction (a commit that started before the hold
            // took neither). A crash between two commits would otherwise leave the change without
            // its key, and the retry the key is for (after a 503 or a lost answer) would make it
            // twice. Another thread may be handing the change over right now (the engine's
            // drainer appends in order): that is waited for a moment, still holding. Only past
            // that is the answer saved once the change is durable, in a commit of its own.
            let change = engine.currentTicket
            var spins = 0
            while engine.appendedTicket < change && spins < 50 {
                usleep(100)
                spins += 1
            }
            if engine.appendedTicket >= change {
                // Submitted here, while the hold lasts (the deferred closure runs after this
                // returns); answered once committed, which the change then is too.
                let pending = PendingAnswer(response)
                store.saveIdempotency(record) {
                    cache.finish(scope, response: response)
                    pending.committed()
                }
                release()
                return .deferred { responder in
                    responder.answerBeforeShutdown()
                    pending.attach(responder)
                }
            }
            return .deferred { responder in
                responder.answerBeforeShutdown()
                engine.whenDurable {
                    store.saveIdempotency(record) {
                        cache.finish(scope, response: response)
                        responder.respond(response)
                    }
                }
            }
        }
    }
}

/// An answer to send once a commit has happened and a responder exists, whichever comes first.
final class PendingAnswer: Sendable {
    private let response: HTTPResponse
    private let state = Lock<(committed: Bool, responder: HTTPResponder?)>((false, nil))

    init(_ response: HTTPResponse) { self.response = response }

    func committed() {
        let responder = state.withLock { s -> HTTPResponder? in
            s.committed = true
            return s.responder
        }
        responder?.respond(response)
    }

    func attach(_ responder: HTTPResponder) {
        let now = state.withLock { s -> Bool in
            s.responder = responder
            return s.committed
        }
        if now { responder.respond(response) }
    }
}
