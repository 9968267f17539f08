import Dispatch
import Locking

/// A streaming (Server-Sent Events) response body.
///
/// Bytes given to `send` are buffered and written as the client reads; the connection is
/// suspended while the buffer is empty, so an idle stream costs no thread and no CPU. A
/// suspended connection does not notice its client leaving: send something now and then
/// (an SSE comment such as `": ping\n\n"`) to find out, and `onClose` fires.
public final class HTTPStream: Sendable {
    struct State {
        var buffer: [UInt8] = []
        /// Bytes of `buffer` already handed to MHD.
        var offset = 0
        var closed = false
        /// True while the connection is suspended waiting for bytes (see `HTTPResponder.State`).
        var suspended = false
        /// Nil once the response is over.
        var connection: MHDConnection?
        var closeCallbacks: [@Sendable () -> Void] = []
        /// Asked for more bytes when the buffer has been sent (see `onDrained`).
        var refill: (@Sendable () -> Void)?
        /// When the server last asked for bytes (uptime nanoseconds).
        var lastProgress = DispatchTime.now().uptimeNanoseconds
    }

    let state: Lock<State>

    init(connection: MHDConnection) {
        state = Lock(State(connection: connection))
    }

    /// Appends `bytes` to the body and wakes the connection; ignored after the stream closed.
    public func send(_ bytes: [UInt8]) {
        guard !bytes.isEmpty else { return }
        state.withLock { state in
            guard !state.closed else { return }
            state.buffer.append(contentsOf: bytes)
            if state.suspended, let connection = state.connection {
                state.suspended = false
                connection.resume()
            }
        }
    }

    /// Appends `bytes` unless the unsent backlog would then pass `maxBacklog` bytes; false then
    /// (nothing appended). The caller should `close()` it — outside any lock that its `onClose`
    /// callbacks take — so the client gets what was buffered, then the end. This is how a client
    /// that does not read costs bounded memory.
    public func send(_ bytes: [UInt8], maxBacklog: Int) -> Bool {
        state.withLock { state in
            guard !state.closed else { return true }
            if state.buffer.count - state.offset + bytes.count > maxBacklog { return false }
            state.buffer.append(contentsOf: bytes)
            if state.suspended, let connection = state.connection {
                state.suspended = false
                connection.resume()
            }
            return true
        }
    }

    /// How long since the server last asked this stream for bytes. libmicrohttpd asks whenever
    /// its own buffer for the connection has room, so a stream that always has more to send
    /// (replaying a backlog) and is not asked for seconds has a client that stopped reading.
    public var idleNanoseconds: UInt64 {
        state.withLock { s in
            let now = DispatchTime.now().uptimeNanoseconds
            return now > s.lastProgress ? now - s.lastProgress : 0
        }
    }

    /// Bytes given to `send` that the client has not been sent yet.
    public var backlog: Int {
        state.withLock { $0.buffer.count - $0.offset }
    }

    /// Registers `refill`, called (on a server thread, outside the stream's lock) whenever
    /// everything buffered has been sent: it may `send` more. A producer with a large backlog
    /// (an event stream from an old cursor) hands it over piece by piece this way, as fast as the
    /// client reads, instead of buffering all of it.
    public func onDrained(_ refill: @escaping @Sendable () -> Void) {
        state.withLock { $0.refill = refill }
    }

    /// Ends the body once the buffered bytes are sent; `onClose` callbacks run now.
    public func close() {
        finish(connectionGone: false)
    }

    /// True once closed by us, by the client going away, or by server shutdown.
    public var isClosed: Bool {
        state.withLock { $0.closed }
    }

    /// Registers `callback` to run once when the stream ends for any reason (at once, on this
    /// thread, if it already has). It may run on a server thread: do not block in it.
    public func onClose(_ callback: @escaping @Sendable () -> Void) {
        let alreadyClosed = state.withLock { state in
            if state.closed { return true }
            state.closeCallbacks.append(callback)
            return false
        }
        if alreadyClosed { callback() }
    }

    /// Closes the stream; with `connectionGone` also forgets the connection (the response is
    /// over, MHD may free it). Runs the close callbacks outside the lock.
    func finish(connectionGone: Bool) {
        let callbacks: [@Sendable () -> Void] = state.withLock { state in
            if connectionGone {
                state.refill = nil
                state.connection = nil
                state.suspended = false
                state.buffer = []
                state.offset = 0
            }
            guard !state.closed else { return [] }
            state.closed = true
            if state.suspended, let connection = state.connection {
                state.suspended = false
                connection.resume()
            }
            let callbacks = state.closeCallbacks
            state.closeCallbacks = []
            return callbacks
        }
        for callback in callbacks { callback() }
    }

    /// Server thread, from MHD's content reader: copies up to `capacity` bytes into `destination`.
    /// Returns the byte count, or -1 at the end of the body, or 0 after suspending the connection
    /// when there is nothing to send yet (returning 0 without suspending makes MHD spin).
    func read(into destination: UnsafeMutableRawPointer, capacity: Int) -> Int {
        var refilled = false
        while true {
            var refill: (@Sendable () -> Void)?
            let result: Int? = state.withLock { state in
                state.lastProgress = DispatchTime.now().uptimeNanoseconds
                let available = state.buffer.count - state.offset
                if available > 0 {
                    let count = min(available, capacity)
                    let offset = state.offset
                    state.buffer.withUnsafeBytes { source in
                        guard let base = source.baseAddress else { return }
                        destination.copyMemory(from: base + offset, byteCount: count)
                    }
                    state.offset += count
                    if state.offset == state.buffer.count {
                        state.buffer.removeAll(keepingCapacity: state.buffer.capacity <= 64 * 1024)
                        state.offset = 0
                    }
                    return count
                }
                guard !state.closed, let connection = state.connection else { return -1 }
                if !refilled, let f = state.refill {
                    refill = f
                    return nil
                }
                state.suspended = true
                connection.suspend()
                return 0
            }
            if let result { return result }
            // Outside the lock: the producer calls `send`, which takes it.
            refilled = true
            refill?()
        }
    }
}
