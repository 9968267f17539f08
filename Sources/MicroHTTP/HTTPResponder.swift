import Dispatch
import Locking

/// Answers a deferred request exactly once, from any thread; later calls are ignored.
///
/// Keep it as long as the answer is pending. It stays safe to use after the client has gone
/// or the server has stopped: `respond` then does nothing.
public final class HTTPResponder: Sendable {
    struct State {
        /// Set by the first `respond`, or when the request ended without an answer.
        var answered = false
        /// The answer, until the server thread takes it to queue it.
        var response: HTTPResponse?
        /// True while the connection is suspended waiting for us. MHD leaves a suspended
        /// connection alone (it cannot complete), so `connection` is valid whenever this is true,
        /// and resuming is only legal while it is true: resuming twice, or a connection that is
        /// not suspended, is undefined in MHD.
        var suspended = false
        /// Nil once the request has ended.
        var connection: MHDConnection?
        /// Answered by its owner even during shutdown (see `answerBeforeShutdown`).
        var keepThroughShutdown = false
        /// A detached responder's taker of its answer (`detached(onAnswer:)`), called once.
        var onAnswer: (@Sendable (HTTPResponse) -> Void)?
        /// A long poll's early answer (`answerEarlyAtShutdown`), taken by the first `hurry`.
        var hurry: (@Sendable () -> Void)?
        /// Set once the server's shutdown has looked at this responder (`respondUnlessKept`): an
        /// early answer given after that is asked for at once.
        var swept = false
    }

    enum Outcome {
        case response(HTTPResponse)
        case suspended
        case ended
    }

    let state: Lock<State>

    init(connection: MHDConnection) {
        state = Lock(State(connection: connection))
    }

    /// Sends `response` (the first call wins). Safe from any thread, also from inside the
    /// `.deferred` closure itself, and after the client has gone (then it does nothing).
    public func respond(_ response: HTTPResponse) {
        let taker = state.withLock { state -> (@Sendable (HTTPResponse) -> Void)? in
            guard !state.answered else { return nil }
            state.answered = true
            state.response = response
            if state.suspended, let connection = state.connection {
                // Under the lock so that the flag and MHD's view never disagree.
                state.suspended = false
                connection.resume()
            }
            state.hurry = nil
            return state.onAnswer.take()
        }
        taker?(response)
    }

    /// Marks this request as one whose answer is on its way (e.g. waiting for a commit): at
    /// shutdown it is waited for, up to the deadline, instead of being answered 503. Long polls
    /// do not call this, so shutdown answers them at once.
    /// False (and nothing marked) when it was answered already, e.g. 503 at shutdown: then
    /// nothing more may be done for it.
    @discardableResult
    public func answerBeforeShutdown() -> Bool {
        state.withLock { s in
            guard !s.answered else { return false }
            s.keepThroughShutdown = true
            return true
        }
    }

    var keepsThroughShutdown: Bool { state.withLock { $0.keepThroughShutdown } }

    /// A long poll says how it answers early, as if its wait had ended now: at shutdown the
    /// server calls `answer` (once, on its own thread) instead of answering 503, and waits for
    /// the answer like one marked `answerBeforeShutdown` (up to the shutdown's deadline), so a
    /// client waiting for work or a change gets the answer its timeout would give, not an
    /// error. `answer` must lead to `respond` soon (it may wait for a commit). A responder that
    /// was answered already ignores it.
    /// One given after the shutdown looked (a request held, then relayed, while the server
    /// stops) is asked for at once, on another thread.
    public func answerEarlyAtShutdown(_ answer: @escaping @Sendable () -> Void) {
        let now = state.withLock { s -> Bool in
            guard !s.answered else { return false }
            guard s.swept else {
                s.hurry = answer
                return false
            }
            s.keepThroughShutdown = true
            return true
        }
        if now { DispatchQueue.global().async(execute: answer) }
    }

    /// Calls the early answer set by `answerEarlyAtShutdown` now (once; later calls and a
    /// responder without one do nothing), marked to be waited for at shutdown. True when there
    /// was one to call: a request relayed by another server (`ClusterFront`) hands its server's
    /// shutdown on to the handler that answers it.
    @discardableResult
    package func hurry() -> Bool {
        let answer = state.withLock { s -> (@Sendable () -> Void)? in
            guard !s.answered, let h = s.hurry.take() else { return nil }
            s.keepThroughShutdown = true
            return h
        }
        answer?()
        return answer != nil
    }

    /// Shutdown: answers `response` unless marked `answerBeforeShutdown`, in one step with the
    /// mark (a request marked a moment later is not also answered here); a long poll with an
    /// early answer (`answerEarlyAtShutdown`) gives that instead, marked or not.
    func respondUnlessKept(_ response: HTTPResponse) {
        let early = state.withLock { state -> (@Sendable () -> Void)? in
            state.swept = true
            guard !state.answered else { return nil }
            // Also for one marked to be waited for since (a long poll held for its queue's new
            // holder, then relayed there): its early answer is sooner than the deadline.
            if let h = state.hurry.take() {
                state.keepThroughShutdown = true
                return h
            }
            guard !state.keepThroughShutdown else { return nil }
            state.answered = true
            state.response = response
            if state.suspended, let connection = state.connection {
                state.suspended = false
                connection.resume()
            }
            return nil
        }
        early?()
    }

    /// True when the client is known to have gone while its answer is pending: the request
    /// ended, or the peer closed or reset its side of the connection (seen with a
    /// non-blocking `MSG_PEEK` on the socket, since MHD does not watch a suspended
    /// connection). Data the client sent meanwhile (a pipelined request) counts as alive, even
    /// if the client closed after it; a client that only half-closed (`shutdown(SHUT_WR)`)
    /// counts as gone; a peer that vanished without FIN or RST counts as alive. For long
    /// polls that hand something out (a claim): a client that left must not be given it. A
    /// caller that finds it gone still answers (any answer), since MHD lets go of a suspended
    /// connection only when it is resumed.
    public var isClientGone: Bool {
        state.withLock { state in
            guard !state.answered, let connection = state.connection else { return true }
            // Under the lock: MHD cannot end the request (and close the socket) meanwhile,
            // because `requestEnded` takes this lock first.
            return !connection.peerIsConnected()
        }
    }

    /// True once `respond` was called, or once the request ended without an answer
    /// (client gone, server stopped).
    public var isAnswered: Bool {
        state.withLock { $0.answered }
    }

    /// Server thread, inside the access handler: the answer if there is one, else suspends the
    /// connection (under the lock, so a concurrent `respond` sees `suspended` and resumes it).
    func takeResponseOrSuspend() -> Outcome {
        state.withLock { state in
            if let response = state.response.take() { return .response(response) }
            guard !state.answered, let connection = state.connection else { return .ended }
            state.suspended = true
            connection.suspend()
            return .suspended
        }
    }

    /// Server thread: the request is over (answered or not); never touch the connection again.
    func requestEnded() {
        state.withLock { state in
            state.answered = true
            state.response = nil
            state.suspended = false
            state.connection = nil
            state.hurry = nil
        }
    }
}
