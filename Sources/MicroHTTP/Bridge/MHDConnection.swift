internal import CMicroHTTPD
import Glibc

/// A libmicrohttpd connection handle, for suspending and resuming from outside the bridge.
///
/// `@unchecked Sendable`: MHD allows `MHD_resume_connection` from any thread; every holder
/// keeps a "suspended" flag under its own lock and only resumes while it is set, because
/// resuming twice or resuming a connection that is not suspended is undefined in MHD.
struct MHDConnection: @unchecked Sendable {
    let raw: OpaquePointer

    /// Only from the access handler or the content reader of this connection (MHD's rule).
    func suspend() {
        MHD_suspend_connection(raw)
    }

    /// From any thread, only while the connection is suspended.
    func resume() {
        MHD_resume_connection(raw)
    }

    /// False when the peer has closed (a read would see end of file) or reset the socket.
    /// Only while the connection is open (its owner's lock keeps MHD from closing it).
    func peerIsConnected() -> Bool {
        let fd = CMicroHTTPD_connection_fd(raw)
        guard fd >= 0 else { return false }
        var byte: UInt8 = 0
        let n = recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
        if n > 0 { return true }
        if n == 0 { return false }
        let e = errno
        return e == EAGAIN || e == EWOULDBLOCK || e == EINTR
    }
}
