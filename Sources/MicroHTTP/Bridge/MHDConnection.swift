internal import CMicroHTTPD

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
}
