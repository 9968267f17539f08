import CCurl
import Dispatch
import Locking

#if canImport(Glibc)
import Glibc
#endif

/// An outbound HTTP/1.1 and HTTP/2 client on libcurl whose failures are values, never traps.
///
/// One background thread per client drives libcurl's multi interface (`curl_multi_poll`,
/// woken by `curl_multi_wakeup` when a request is added or cancelled), so many requests in
/// flight cost one thread. libcurl keeps finished connections in the multi handle's cache
/// (up to 64), so requests to the same origin reuse a keep-alive connection; the client keeps up
/// to 64 finished easy handles, reset, for the next requests (`EasyHandlePool`). Redirects are
/// followed by this client, not libcurl (unless ``OutboundRequest/followRedirects`` is off): at most
/// ``RedirectPolicy/maxRedirects``, http/https only, each `Location` resolved and checked
/// with libcurl's URL API (see ``RedirectPolicy``). Bodies are cut at
/// ``OutboundRequest/maxResponseBytes`` and header blocks at ``OutboundRequest/maxHeaderBytes``,
/// so memory per request is bounded whatever the target sends; ``OutboundRequest/timeout``
/// bounds the whole exchange. Proxies from the environment (`http_proxy`, ...) apply as in curl
/// unless ``OutboundRequest/useProxy`` is off.
///
/// **Completion rule.** The completion of each ``send(_:completion:)`` is called exactly once:
/// with the response or error on the client's thread, or with `cancelled` on the thread that
/// calls ``OutboundTask/cancel()`` first. It is never called with a lock of the client held,
/// and never after `cancel()` has returned: a `cancel()` that races with a completion already
/// running waits for it to return (unless called from inside that completion). So do not call
/// `cancel()` while holding a lock that the completion takes.
public final class OutboundHTTPClient: Sendable {
    let loop: CurlLoop

    /// Starts the client's thread.
    public init() {
        loop = CurlLoop()
        loop.start()
    }

    /// Stops the thread; exchanges still in flight complete with `cancelled`.
    deinit { loop.stop() }

    /// Sends `request`; `completion` receives the final response (any status) or the error.
    @discardableResult
    public func send(
        _ request: OutboundRequest,
        completion: @escaping @Sendable (Result<OutboundResponse, OutboundError>) -> Void
    ) -> OutboundTask {
        let task = OutboundTask(request: request, loop: loop, completion: completion)
        loop.submit(task)
        return task
    }
}

extension OutboundHTTPClient {
    /// Runs `job` on the client's thread the next time it wakes (at once, on this thread, once
    /// the client has stopped). What the job sends starts in that same pass. A caller that has
    /// several requests to make as they come can gather them until then and send them as one.
    public func onLoop(_ job: @escaping @Sendable () -> Void) {
        loop.perform(job)
    }
}

/// One exchange of an ``OutboundHTTPClient``.
public final class OutboundTask: Sendable {
    enum State: Sendable, Equatable {
        case pending
        case delivering(pthread_t)
        case done
    }

    let request: OutboundRequest
    let loop: CurlLoop
    /// The state, and the completion until it is called (then nil, which also frees what it captured).
    private let state: Lock<(State, (@Sendable (Result<OutboundResponse, OutboundError>) -> Void)?)>
    private let delivered = DispatchGroup()

    init(
        request: OutboundRequest, loop: CurlLoop,
        completion: @escaping @Sendable (Result<OutboundResponse, OutboundError>) -> Void
    ) {
        self.request = request
        self.loop = loop
        state = Lock((.pending, completion))
        delivered.enter()
    }

    /// True once the completion has been called or is being called.
    var isSettled: Bool { state.withLock { $0.0 != .pending } }

    /// Takes the completion when nothing has claimed it yet; returns the state before.
    private func claim() -> (State, (@Sendable (Result<OutboundResponse, OutboundError>) -> Void)?) {
        let me = pthread_self()
        return state.withLock { s in
            let before = s.0
            guard before == .pending else { return (before, nil) }
            let completion = s.1
            s = (.delivering(me), nil)
            return (before, completion)
        }
    }

    private func settled() {
        state.withLock { $0.0 = .done }
        delivered.leave()
    }

    /// Calls the completion unless it was already called; false when it was.
    @discardableResult
    func deliver(_ result: Result<OutboundResponse, OutboundError>) -> Bool {
        let (before, completion) = claim()
        guard before == .pending else { return false }
        completion?(result)
        settled()
        return true
    }

    /// Aborts the exchange. When the completion has not been called yet it is called now,
    /// on this thread, with `cancelled`; libcurl's transfer is dropped by the client's thread
    /// right after (within milliseconds). Calling it again, or after the end, does nothing.
    public func cancel() {
        let (before, completion) = claim()
        switch before {
        case .pending:
            completion?(.failure(OutboundError(type: "cancelled", detail: "request to \(OutboundURL.quoted(request.url)) aborted")))
            settled()
            loop.cancel(self)
        case let .delivering(thread):
            if pthread_equal(thread, pthread_self()) == 0 { delivered.wait() }
        case .done:
            break
        }
    }
}
