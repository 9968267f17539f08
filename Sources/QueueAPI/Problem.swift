import MicroHTTP
import QueueEngine
import QueueKinds

// `Problem` and `ProblemConvertible` live in MicroHTTP, so the server's own answers (413,
// 431, 500, 503) and the API's share one type and one slug set. Every error a handler throws
// is `ProblemConvertible`; the dispatcher (`APIDispatcher.handle`) is the one place that turns
// errors into answers.

extension Problem {
    package static func badRequest(_ detail: String) -> Problem { Problem(400, "malformed-request", "Malformed request", detail) }
    static func invalid(_ field: String, _ detail: String) -> Problem {
        Problem(422, "invalid-field", "Invalid field", "\(field): \(detail)")
    }
    static func notFound(_ detail: String) -> Problem { Problem(404, "not-found", "Not Found", detail) }
    /// `?limit=0x10&limit=5`: which one counts is a guess, so neither does.
    package static func repeatedQueryParameter(_ name: String) -> Problem { invalid(name, "appears more than once; give each query parameter once") }
    static func conflict(_ detail: String) -> Problem { Problem(409, "conflict", "Conflict", detail) }

    /// 503 `no-owner`, with `Retry-After: 1`: no instance serves the queue right now (it is
    /// moving, or a takeover is under way). The one builder of it; `detail` says which case.
    package static func noOwner(_ detail: String) -> Problem {
        Problem(503, "no-owner", "No owner", detail, headers: [("Retry-After", "1")])
    }

    /// 503 `not-ready` from `/readyz`: the one builder of it; `detail` says why.
    package static func notReady(_ detail: String) -> Problem { Problem(503, "not-ready", "Not ready", detail) }
}

extension EngineError: ProblemConvertible {
    /// The HTTP meaning of each domain error (the one place that decides it).
    public var problem: Problem {
        switch self {
        case let .queueNotFound(name): return .notFound("no queue named '\(name)'")
        case let .queueExists(name): return Problem(409, "queue-exists", "Queue exists", "a queue named '\(name)' already exists")
        case let .queueNotIdle(name, n):
            return Problem(
                409, "queue-not-idle", "Queue not idle", "queue '\(name)' has \(n) unfinished operation(s); finish or cancel them, or DELETE with ?force=true")
        case let .operationNotFound(id): return .notFound("no operation with id '\(id)'")
        case let .invalidTransition(from, action):
            return Problem(
                409, "invalid-transition", "Transition not allowed",
                "cannot \(action.verb) an operation that is \(from.rawValue)" + action.hint(from))
        case let .dependencyCycle(detail): return Problem(409, "dependency-cycle", "Dependency cycle", detail)
        case let .alreadyStarted(id):
            return Problem(
                409, "already-started", "Operation already started", "operation \(id) has started; priority and dependencies can change only before it starts")
        case let .invalidArgument(field, detail): return .invalid(field, detail)
        case let .unknownKind(kind, allowed):
            return .invalid("kind", "unknown kind '\(kind)'; allowed: \(allowed.joined(separator: ", "))")
        case let .notPermitted(field, reason, detail):
            return Problem(403, reason, "Forbidden", "\(field): \(detail)")
        case let .limitReached(detail, limit):
            return Problem(429, limit, "Too Many Requests", detail, headers: [("Retry-After", "5")])
        case let .notCopyable(detail): return Problem(409, "not-copyable", "Operation cannot be copied", detail)
        case let .unavailable(detail): return Problem(503, "store-unavailable", "Store unavailable", detail, headers: [("Retry-After", "1")])
        case let .limiterNotFound(name): return .notFound("no limiter named '\(name)'")
        case let .scheduleNotFound(queue, name): return .notFound("queue '\(queue)' has no schedule named '\(name)'")
        case let .hostNotFound(name): return .notFound("no host '\(name)' is tracked; hosts are tracked once an operation sends to them or a PATCH names them")
        case let .conflict(slug, detail): return Problem(409, slug, "Conflict", detail)
        case let .notHere(queue):
            return .noOwner("queue '\(queue)' is moving to another instance of the cluster; retry shortly, with an Idempotency-Key for changes")
        }
    }
}

extension OperationAction {
    var verb: String {
        switch self {
        case .dependenciesMet: return "release"
        case .start: return "start"
        case .complete: return "finish"
        case .cancel: return "cancel"
        case .pause: return "pause"
        case .resume: return "resume"
        case .dependencyAdded: return "hold back"
        case .hold: return "hold"
        }
    }
    func hint(_ from: OperationState) -> String {
        switch self {
        case .pause: return "; only pending, ready or executing operations can be paused"
        case .resume: return "; only paused operations can be resumed"
        case .cancel: return "; it has already finished"
        default: return ""
        }
    }
}

extension ExternalKind.LeaseError: ProblemConvertible {
    public var problem: Problem {
        switch self {
        case let .notLeased(detail): return Problem(409, "lease-conflict", "Lease conflict", detail)
        }
    }
}

/// The store could not be read (a durable store's history, a cluster's reads of what other
/// instances committed): 503, retry shortly.
package struct StoreReadUnavailable: Error, ProblemConvertible {
    package let detail: String
    package init(detail: String) { self.detail = detail }
    package var problem: Problem {
        Problem(503, "store-unavailable", "Store unavailable", "cannot read from the store: \(detail)", headers: [("Retry-After", "1")])
    }
}
