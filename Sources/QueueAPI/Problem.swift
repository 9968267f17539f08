import MicroHTTP
import QueueEngine

/// An RFC 9457 problem: every 4xx/5xx answer of the API is one.
public struct Problem: Error, Sendable {
    public var status: Int
    /// Short slug; the `type` URI is `https://opqd.dev/problems/<slug>`.
    public var slug: String
    public var title: String
    public var detail: String
    public var headers: [(String, String)] = []

    public init(_ status: Int, _ slug: String, _ title: String, _ detail: String, headers: [(String, String)] = []) {
        self.status = status; self.slug = slug; self.title = title; self.detail = detail; self.headers = headers
    }

    static func badRequest(_ detail: String) -> Problem { Problem(400, "malformed-request", "Malformed request", detail) }
    static func invalid(_ field: String, _ detail: String) -> Problem {
        Problem(422, "invalid-field", "Invalid field", "\(field): \(detail)")
    }
    static func notFound(_ detail: String) -> Problem { Problem(404, "not-found", "Not Found", detail) }
    static func conflict(_ detail: String) -> Problem { Problem(409, "conflict", "Conflict", detail) }

    public var response: HTTPResponse {
        var out: [UInt8] = []
        out.reserveCapacity(160 + detail.utf8.count)
        out.append(contentsOf: #"{"type":"https://opqd.dev/problems/"#.utf8)
        out.append(contentsOf: slug.utf8)
        out.append(contentsOf: #"","title":"#.utf8)
        JSONWriter.string(title, to: &out)
        out.append(contentsOf: #","status":"#.utf8)
        JSONWriter.integer(status, to: &out)
        out.append(contentsOf: #","detail":"#.utf8)
        JSONWriter.string(detail, to: &out)
        out.append(UInt8(ascii: "}"))
        return HTTPResponse(status: status, headers: [("Content-Type", "application/problem+json")] + headers, body: out)
    }
}

extension EngineError {
    /// The HTTP meaning of each domain error (the one place that decides it).
    var problem: Problem {
        switch self {
        case let .queueNotFound(name): return .notFound("no queue named '\(name)'")
        case let .queueExists(name): return Problem(409, "queue-exists", "Queue exists", "a queue named '\(name)' already exists")
        case let .queueNotIdle(name, n):
            return Problem(409, "queue-not-idle", "Queue not idle", "queue '\(name)' has \(n) unfinished operation(s); finish or cancel them, or DELETE with ?force=true")
        case let .operationNotFound(id): return .notFound("no operation with id '\(id)'")
        case let .invalidTransition(from, action):
            return Problem(409, "invalid-transition", "Transition not allowed",
                           "cannot \(action.verb) an operation that is \(from.rawValue)" + action.hint(from))
        case let .dependencyCycle(detail): return Problem(409, "dependency-cycle", "Dependency cycle", detail)
        case let .alreadyStarted(id):
            return Problem(409, "already-started", "Operation already started", "operation \(id) has started; priority and dependencies can change only before it starts")
        case let .invalidArgument(field, detail): return .invalid(field, detail)
        case let .unknownKind(kind):
            return .invalid("kind", "unknown kind '\(kind)'; allowed: delay, http, command, external")
        case let .limitReached(detail, limit):
            return Problem(429, limit, "Too Many Requests", detail, headers: [("Retry-After", "5")])
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
