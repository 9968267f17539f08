import CCurl
import Dispatch
import Locking
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The client's thread and libcurl multi handle. Only `submit`, `cancel` and `stop` are
/// called from other threads; everything else runs on the loop thread.
final class CurlLoop: @unchecked Sendable {  // `transfers` and `handles` are touched only on the loop thread
    struct Inbox {
        var adds: [OutboundTask] = []
        var cancels: [OutboundTask] = []
        /// Run on the loop thread at its next pass, before the adds (`OutboundHTTPClient.onLoop`).
        var jobs: [@Sendable () -> Void] = []
        var stopped = false
    }

    /// libcurl's global state, initialised once before the first handle (not thread-safe itself).
    static let globalInit: Bool = curl_global_init(CCurl_CURL_GLOBAL_DEFAULT) == CURLE_OK

    let multi: UnsafeMutableRawPointer?
    private let inbox = Lock(Inbox())
    /// Transfers in libcurl, by easy handle. Loop thread only.
    private var transfers: [UnsafeMutableRawPointer: Transfer] = [:]
    /// Idle easy handles for the next transfers. Loop thread only.
    private var handles = EasyHandlePool()
    /// Easy handles alive (idle or in a transfer) as of the loop's last pass: 0 once the loop
    /// has ended. For tests (``liveHandleCount``).
    private let liveHandles = Atomic<Int>(0)

    /// Easy handles alive as of the loop's last pass (it lags a completion by a moment).
    var liveHandleCount: Int { liveHandles.load(ordering: .relaxed) }

    init() {
        _ = Self.globalInit
        multi = curl_multi_init()
        if let multi {
            _ = CCurl_multi_setopt_long(multi, CURLMOPT_MAXCONNECTS, 64)
        }
    }

    deinit {
        if let multi { curl_multi_cleanup(multi) }
    }

    func start() {
        guard multi != nil else {
            inbox.withLock { $0.stopped = true }
            return
        }
        let context = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        let rc = pthread_create(
            &thread, nil,
            { raw in
                guard let raw else { return nil }
                let loop = Unmanaged<CurlLoop>.fromOpaque(raw).takeRetainedValue()
                loop.run()
                return nil
            }, context)
        if rc == 0 {
            pthread_detach(thread)
        } else {
            Unmanaged<CurlLoop>.fromOpaque(context).release()
            inbox.withLock { $0.stopped = true }
        }
    }

    func submit(_ task: OutboundTask) {
        let accepted = inbox.withLock { box -> Bool in
            guard !box.stopped else { return false }
            box.adds.append(task)
            return true
        }
        if accepted, let multi {
            curl_multi_wakeup(multi)
        } else {
            task.deliver(.failure(OutboundError(type: "cancelled", detail: "the HTTP client is shut down")))
        }
    }

    /// Runs `job` on the loop thread at its next pass (at once, here, once the loop stopped).
    func perform(_ job: @escaping @Sendable () -> Void) {
        let accepted = inbox.withLock { box -> Bool in
            guard !box.stopped else { return false }
            box.jobs.append(job)
            return true
        }
        if accepted, let multi { curl_multi_wakeup(multi) } else { job() }
    }

    func cancel(_ task: OutboundTask) {
        let queued = inbox.withLock { box -> Bool in
            guard !box.stopped else { return false }
            box.cancels.append(task)
            return true
        }
        if queued, let multi { curl_multi_wakeup(multi) }
    }

    func stop() {
        inbox.withLock { $0.stopped = true }
        if let multi { curl_multi_wakeup(multi) }
    }

    // MARK: - loop thread

    private func run() {
        guard let multi else { return }
        var done: [(UnsafeMutableRawPointer, CURLcode)] = []
        while true {
            var box = inbox.withLock { box -> Inbox in
                let taken = box
                box.adds = []
                box.cancels = []
                box.jobs = []
                return taken
            }
            if !box.jobs.isEmpty {
                for job in box.jobs { job() }
                // What the jobs sent starts in this pass, not after another wake-up.
                box.adds += inbox.withLock { inbox -> [OutboundTask] in
                    defer { inbox.adds = [] }
                    return inbox.adds
                }
            }
            for task in box.adds where !task.isSettled { begin(Transfer(task)) }
            for task in box.cancels {
                if let (easy, _) = transfers.first(where: { $0.value.task === task }) { drop(easy) }
            }
            if box.stopped { break }

            var running: Int32 = 0
            _ = curl_multi_perform(multi, &running)
            var left: Int32 = 0
            done.removeAll(keepingCapacity: true)
            while let message = curl_multi_info_read(multi, &left) {
                if message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle {
                    done.append((easy, message.pointee.data.result))
                }
            }
            for (easy, code) in done { finished(easy, code) }
            liveHandles.store(handles.live, ordering: .relaxed)
            _ = curl_multi_poll(multi, nil, 0, 1000, nil)
        }
        let shutdown = OutboundError(type: "cancelled", detail: "the HTTP client is shut down")
        for (easy, transfer) in transfers {
            drop(easy)
            transfer.task.deliver(.failure(shutdown))
        }
        handles.drain()
        liveHandles.store(handles.live, ordering: .relaxed)
        // Tasks and jobs that arrived after the last look at the inbox (a job's sends fail at once).
        for job in inbox.withLock({ $0.jobs }) { job() }
        for task in inbox.withLock({ $0.adds }) { task.deliver(.failure(shutdown)) }
    }

    /// Starts the transfer's current hop, or ends the task when it cannot.
    private func begin(_ transfer: Transfer) {
        guard let multi else { return }
        switch transfer.makeHandle(from: &handles) {
        case let .failure(error):
            transfer.task.deliver(.failure(transfer.hopError(error)))
        case let .success(easy):
            transfers[easy] = transfer
            if curl_multi_add_handle(multi, easy) != CURLM_OK {
                drop(easy)
                transfer.task.deliver(.failure(OutboundError(type: "network", detail: "libcurl refused the transfer")))
            }
        }
    }

    /// Removes an easy handle from libcurl and from its transfer; keeps it for another transfer
    /// when `reusable` (its transfer ended normally), else frees it.
    private func drop(_ easy: UnsafeMutableRawPointer, reusable: Bool = false) {
        guard let transfer = transfers.removeValue(forKey: easy) else { return }
        let removed = multi.map { curl_multi_remove_handle($0, easy) == CURLM_OK } ?? false
        transfer.release(easy, to: &handles, reusable: reusable && removed)
    }

    /// A hop ended: answer, follow the redirect, or fail.
    private func finished(_ easy: UnsafeMutableRawPointer, _ code: CURLcode) {
        guard let transfer = transfers[easy] else { return }
        var status = 0
        var length: Int?
        var code32: Int = 0
        if CCurl_easy_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &code32) == CURLE_OK { status = code32 }
        var declared: curl_off_t = -1
        if CCurl_easy_getinfo_off_t(easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &declared) == CURLE_OK, declared >= 0 {
            length = Int(exactly: declared)
        }
        // libcurl's message is made a string only for a failure, not for every answer.
        let message = code == CURLE_OK ? "" : transfer.curlMessage(code)
        drop(easy, reusable: code == CURLE_OK)
        guard !transfer.task.isSettled else { return }
        switch transfer.outcome(code, status: status, message: message) {
        case let .failure(error):
            transfer.task.deliver(.failure(error))
        case .success:
            guard transfer.request.followRedirects else {
                transfer.task.deliver(.success(transfer.response(status: status, contentLength: length)))
                return
            }
            let decision = RedirectPolicy.next(
                status: status, location: transfer.header.value("location"),
                currentURL: transfer.url, method: transfer.method,
                redirects: transfer.redirects)
            switch decision {
            case .stop:
                transfer.task.deliver(.success(transfer.response(status: status, contentLength: length)))
            case let .fail(error):
                transfer.task.deliver(.failure(error))
            case let .follow(hop):
                transfer.follow(hop)
                begin(transfer)
            }
        }
    }
}
