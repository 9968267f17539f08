import Locking
import MicroHTTP
import QueueEngine
import StoreKit

/// Every 2xx to a change is durable: answers wait for the commit that holds the change, and a
/// create with an `Idempotency-Key` keeps its answer (durably too) for a repeat.
package struct Durability: Sendable {
    package init(engine: QueueEngine, idempotency: IdempotencyCache, store: any DurableStore, retain: Double) {
        self.engine = engine
        self.idempotency = idempotency
        self.store = store
        self.retain = retain
    }

    let engine: QueueEngine
    let idempotency: IdempotencyCache
    let store: any DurableStore
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
            let (engine, cache, durable) = (self.engine, idempotency, store.isDurable)
            // The kept answer rides in the change's own records, right behind it (`withSlot`): the
            // store commits both in one transaction. A crash between two commits would otherwise
            // leave the change without its key, and the retry the key is for (after a 503 or a
            // lost answer) would make it twice.
            let (outcome, slot) = engine.withSlot { () -> Result<HTTPResponse, any Error> in
                do {
                    return .success(try body())
                } catch let error where QueueAbsent.matches(error) {
                    // Not kept: nothing was done, and the queue may be there at the retry (created
                    // since, or this instance's again after a handover). Answered at once, so a
                    // cluster's front can tell it from an answer and hold the request for the
                    // queue's next holder (`ClusterFront.queueMissing`).
                    return .failure(error)
                } catch let error as any ProblemConvertible {
                    // A refusal is an answer too: a repeat with the same key gets the same refusal.
                    return .success(error.problem.response)
                } catch {
                    return .failure(error)
                }
            }
            let response: HTTPResponse
            switch outcome {
            case let .success(r): response = r
            case let .failure(error):
                if let slot { engine.fill(slot, with: nil) }
                cache.abandon(scope)
                throw error
            }
            // A refusal that may pass (429, 5xx) is not kept: a retry with the same key gets a new try.
            if response.status == 429 || response.status >= 500 {
                if let slot { engine.fill(slot, with: nil) }
                cache.abandon(scope)
                return .response(response)
            }
            guard durable else {
                if let slot { engine.fill(slot, with: nil) }
                cache.finish(scope, response: response)
                return .response(response)
            }
            let record = IdempotencyRecord(
                scope: scope, bodyHash: bodyHash, status: response.status,
                headers: response.headers, body: response.body, createdAt: SystemClock().now())
            if let slot {
                engine.fill(slot, with: .kept(record))
            } else {
                // Nothing changed (a refusal kept as the answer): the record alone.
                engine.keep(.kept(record))
            }
            // Until the change and the kept answer are committed, a retry gets 409 in-progress,
            // never a replay of an answer a crash could still take back.
            return .deferred { responder in
                responder.answerBeforeShutdown()
                engine.whenDurable {
                    cache.finish(scope, response: response)
                    responder.respond(response)
                }
            }
        }
    }
}

/// A refusal because a queue named in the request is not there (a batch element's queue): the
/// request changed nothing. Answered like any problem, but never kept for an `Idempotency-Key`.
package struct QueueAbsent: Error, ProblemConvertible {
    package let queue: String
    package let problem: Problem

    /// True for the engine's `queueNotFound` and for this.
    static func matches(_ error: any Error) -> Bool {
        if error is QueueAbsent { return true }
        if case .queueNotFound? = error as? EngineError { return true }
        return false
    }
}
