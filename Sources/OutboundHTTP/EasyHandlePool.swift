import CCurl

/// The idle libcurl easy handles of one ``CurlLoop``, kept for its next transfers. Loop thread
/// only (libcurl handles are not thread-safe).
///
/// A new handle per request (`curl_easy_init`, the options, `curl_easy_cleanup`) was the larger
/// part of the client's CPU per request: the handle is one large zeroed allocation plus its
/// resolver, its receive buffer and its defaults, all built and freed again each time. A handle
/// whose transfer ended normally comes back here instead and is `curl_easy_reset` at once.
///
/// Why reset on the way in, not on the way out: reset clears every option (header list, body,
/// method and `NOBODY`, proxy, timeouts, the callbacks with their data pointers, the error buffer),
/// so an idle handle points at no transfer's memory, and the transfer that takes it next sets
/// all of its own options on a handle that knows nothing of the one before. Reset keeps what is
/// worth keeping: the buffers and the resolver. Connections and the DNS cache belong to the multi
/// handle while an easy handle is in it (libcurl's rule), so keep-alive does not depend on this pool.
struct EasyHandlePool: ~Copyable {
    /// Idle handles kept at most: as many as the multi handle keeps connections
    /// (`CURLMOPT_MAXCONNECTS`), so a burst of that many transfers to one owner reuses them all.
    static let capacity = 64

    private var idle: [UnsafeMutableRawPointer] = []
    /// Handles made and not cleaned up yet, idle or in a transfer.
    private(set) var live = 0

    init() { idle.reserveCapacity(Self.capacity) }

    /// An idle handle with libcurl's defaults, or a new one; nil when libcurl cannot make one.
    mutating func take() -> UnsafeMutableRawPointer? {
        if let easy = idle.popLast() { return easy }
        guard let easy = curl_easy_init() else { return nil }
        live += 1
        return easy
    }

    /// Takes back a handle that is out of the multi handle: reset and kept when `reusable` and
    /// there is room, else cleaned up. A handle whose transfer failed, was cut short or was
    /// abandoned is not reusable: nothing of such a transfer is worth carrying into the next.
    mutating func giveBack(_ easy: UnsafeMutableRawPointer, reusable: Bool) {
        guard reusable, idle.count < Self.capacity else { return discard(easy) }
        curl_easy_reset(easy)
        idle.append(easy)
    }

    /// Cleans up a handle that is out of the multi handle.
    mutating func discard(_ easy: UnsafeMutableRawPointer) {
        curl_easy_cleanup(easy)
        live -= 1
    }

    /// Cleans up every idle handle (the client is shutting down).
    mutating func drain() {
        for easy in idle { curl_easy_cleanup(easy) }
        live -= idle.count
        idle.removeAll()
    }
}
