import Grammar
import MicroHTTP
import QueueEngine

/// Long polls whose subject leaves this instance while they wait (a cluster handover moves its
/// queue): `GET /v1/operations/{id}/wait` and `GET /v1/queues/{name}/wait` answer `moved`,
/// which the cluster front (`ClusterFront`) never shows: it asks the queue's new holder for
/// the rest of the wait. Anywhere else (no front) it is a plain 503 `no-owner`.
package enum LongPoll {
    /// Marks a `moved` answer.
    package static let movedHeader = "Opqd-Long-Poll-Moved"

    /// 503 `no-owner` with `movedHeader`: the wait's subject went to another instance.
    package static func moved(_ detail: String) -> HTTPResponse {
        var problem = Problem.noOwner(detail)
        problem.headers.append((movedHeader, "1"))
        return problem.response
    }

    /// True for a `moved` answer.
    package static func isMoved(_ response: HTTPResponse) -> Bool {
        response.status == 503 && response.headers.contains { $0.0 == movedHeader }
    }

    /// Ends a long poll that is waiting with `timedOut` (which cancels its wait and answers
    /// as the timeout answers, if it has not been answered yet): after `seconds`, or at once
    /// when the server shuts down (`HTTPResponder.answerEarlyAtShutdown`), whichever comes first.
    package static func ends(
        _ responder: HTTPResponder, after seconds: Double, on scheduler: any EngineScheduler, _ timedOut: @escaping @Sendable () -> Void
    ) {
        responder.answerEarlyAtShutdown(timedOut)
        scheduler.after(seconds: seconds, timedOut)
    }

    /// The query parameter that holds a long poll's wait in seconds (`wait` or `timeout`).
    package static let waitParameters = ["wait", "timeout"]

    /// What `GET /v1/operations/{id}/wait` and `GET /v1/queues/{name}/wait` wait without a
    /// `timeout` (API.md). The feed and a claim do not wait without their `wait`.
    package static let defaultWaitSeconds = 30.0

    /// True for the two waits (`/v1/operations/{id}/wait`, `/v1/queues/{name}/wait`, GET or
    /// HEAD): long polls also without a `timeout`. Not a queue or a schedule named "wait".
    static func isWait(_ request: HTTPRequest) -> Bool {
        guard request.method == "GET" || request.method == "HEAD" else { return false }
        let parts = request.path.split(separator: "/", omittingEmptySubsequences: false)
        return parts.count == 5 && parts[0].isEmpty && parts[1] == "v1" && (parts[2] == "operations" || parts[2] == "queues") && parts[4] == "wait"
    }

    /// How long `request` may wait as a long poll, in seconds: its `wait` or `timeout` when it
    /// is a usable number above 0, a wait's default without one; nil when it does not wait.
    /// Defensive: the handler validates the value and refuses a bad one; here a bad one only
    /// means "not a long poll".
    package static func seconds(_ request: HTTPRequest) -> Double? {
        for key in waitParameters {
            guard let text = request.query[key] else { continue }
            if case let .success(seconds) = DecimalNumber.decimal(text, in: 0...Double.greatestFiniteMagnitude), seconds > 0 { return seconds }
            return nil
        }
        return isWait(request) ? defaultWaitSeconds : nil
    }

    /// `request` with its wait (`wait` or `timeout`, a wait's `timeout` when it gave none) set
    /// to `seconds`, rounded down to the millisecond; the method, path, query and headers (less
    /// those named, lowercase, in `dropping`) are kept, and the body only with `keepingBody`.
    /// Nil when it is no long poll.
    package static func request(
        _ request: HTTPRequest, waiting seconds: Double, dropping: Set<String> = [], keepingBody: Bool = false
    ) -> HTTPRequest? {
        guard let key = waitParameters.first(where: { request.query[$0] != nil }) ?? (isWait(request) ? "timeout" : nil) else { return nil }
        var query = request.query
        let ms = seconds.isFinite ? Int(max(0, min(seconds, 3600)) * 1000) : 0
        query[key] = ms % 1000 == 0 ? String(ms / 1000) : String(ms / 1000) + "." + String(String(ms % 1000 + 1000).dropFirst())
        return HTTPRequest(
            id: request.id, method: request.method, path: request.path, query: query, repeatedQueryNames: request.repeatedQueryNames,
            headers: dropping.isEmpty ? request.headers : request.headers.filter { !dropping.contains($0.key) },
            body: keepingBody ? request.body : [])
    }
}
