import Foundation
import Spawning
import TestKit

#if canImport(Glibc)
import Glibc
#endif

/// Separate "hosts" on this machine: one network namespace per instance, each with a veth pair
/// whose outer end is on a bridge in the test's namespace (address .1), and PostgreSQL reached
/// through a TCP relay on the bridge address (the test server listens on 127.0.0.1 only).
/// `cut` takes an instance's link down (nothing in or out: PostgreSQL, the other instances, the
/// clients), `restore` brings it back. Needs root and `ip`; `make` says why not otherwise.
final class NetworkLab: @unchecked Sendable {  // set up once, then only read
    let names: (bridge: String, namespaces: [String], veths: [String])
    /// The bridge's address (the relay's host) and each namespace's.
    let gateway: String
    let hosts: [String]
    /// `postgres://…@gateway:relayPort/…`: the database URL as the namespaces reach it.
    private(set) var relayPort = 0
    private var relay: ChildProcess?
    private var created: [[String]] = []

    /// Sets up `count` namespaces, or returns nil with the reason (not root, no `ip`, no netns).
    static func make(count: Int) -> (NetworkLab?, String) {
        guard getuid() == 0 else { return (nil, "not root") }
        guard FileManager.default.isExecutableFile(atPath: ip) else { return (nil, "no \(ip)") }
        let lab = NetworkLab(count: count)
        do {
            try lab.setUp()
            return (lab, "")
        } catch {
            lab.tearDown()
            return (nil, "\(error)")
        }
    }

    static let ip = "/usr/sbin/ip"

    private init(count: Int) {
        let tag = String(UInt32.random(in: 0x1000...0xFFFF), radix: 16)
        let net = Int.random(in: 16...250)
        names = ("obr\(tag)", (0..<count).map { "opqd-\(tag)-\($0)" }, (0..<count).map { "ov\(tag)\($0)" })
        gateway = "10.213.\(net).1"
        hosts = (0..<count).map { "10.213.\(net).\(10 + $0)" }
    }

    /// Runs `ip` with `arguments`; throws with its stderr when it fails.
    @discardableResult
    static func run(_ arguments: [String]) throws -> String {
        let errors = NSTemporaryDirectory() + "opqd-ip-\(UInt64.random(in: 0...UInt64.max)).err"
        defer { try? FileManager.default.removeItem(atPath: errors) }
        let (code, output) = try ChildProcess.capture(ip, arguments, stderr: .file(errors, append: false))
        guard code == 0 else {
            throw TestClientError("ip \(arguments.joined(separator: " ")) failed: \((try? String(contentsOfFile: errors, encoding: .utf8)) ?? "")")
        }
        return String(decoding: output, as: UTF8.self)
    }

    private func setUp() throws {
        try Self.run(["link", "add", names.bridge, "type", "bridge"])
        created.append(["link", "del", names.bridge])
        try Self.run(["addr", "add", gateway + "/24", "dev", names.bridge])
        try Self.run(["link", "set", names.bridge, "up"])
        for (i, ns) in names.namespaces.enumerated() {
            let outer = names.veths[i]
            let inner = outer + "p"
            try Self.run(["netns", "add", ns])
            created.append(["netns", "del", ns])
            try Self.run(["link", "add", outer, "type", "veth", "peer", "name", inner])
            created.append(["link", "del", outer])
            try Self.run(["link", "set", inner, "netns", ns])
            try Self.run(["link", "set", outer, "master", names.bridge])
            try Self.run(["link", "set", outer, "up"])
            try Self.run(["netns", "exec", ns, Self.ip, "addr", "add", hosts[i] + "/24", "dev", inner])
            try Self.run(["netns", "exec", ns, Self.ip, "link", "set", inner, "up"])
            try Self.run(["netns", "exec", ns, Self.ip, "link", "set", "lo", "up"])
        }
    }

    /// Starts the relay from `gateway` to the PostgreSQL server of `database` (127.0.0.1) and
    /// returns the URL the namespaces use for that database.
    func relayedURL(_ database: String) throws -> String {
        guard let scheme = database.range(of: "://"), let at = database[scheme.upperBound...].firstIndex(of: "@") else {
            throw TestClientError("cannot read host and port from \(database)")
        }
        let rest = database[database.index(after: at)...]
        let end = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
        let hostPort = rest[..<end]
        guard let colon = hostPort.lastIndex(of: ":"), let port = Int(hostPort[hostPort.index(after: colon)...]) else {
            throw TestClientError("no port in \(database)")
        }
        let target = String(hostPort[..<colon])
        if relay == nil {
            var request = SpawnRequest(["/usr/bin/env", "python3", "-c", Self.relayScript, gateway, target, String(port)])
            request.stdout = .pipe
            let child = try ChildProcess(request)
            guard let line = child.readLine(timeout: 10), let p = Int(line) else {
                child.signal(SIGKILL)
                throw TestClientError("the PostgreSQL relay did not start")
            }
            relay = child
            relayPort = p
        }
        return String(database[..<database.index(after: at)]) + "\(gateway):\(relayPort)" + String(rest[end...])
    }

    /// A TCP relay (asyncio): listens on argv[1]:0, prints its port, copies every connection to argv[2]:argv[3].
    static let relayScript = """
        import asyncio, sys
        async def pipe(r, w):
            try:
                while True:
                    d = await r.read(65536)
                    if not d:
                        break
                    w.write(d)
                    await w.drain()
            except Exception:
                pass
            finally:
                try:
                    w.close()
                except Exception:
                    pass
        async def handle(r, w):
            try:
                ur, uw = await asyncio.open_connection(sys.argv[2], int(sys.argv[3]))
            except Exception:
                w.close()
                return
            await asyncio.gather(pipe(r, uw), pipe(ur, w))
        async def main():
            server = await asyncio.start_server(handle, sys.argv[1], 0)
            print(server.sockets[0].getsockname()[1], flush=True)
            async with server:
                await server.serve_forever()
        asyncio.run(main())
        """

    /// The argv prefix that runs a program in instance `i`'s namespace.
    func launcher(_ i: Int) -> [String] { [Self.ip, "netns", "exec", names.namespaces[i]] }

    /// Takes instance `i`'s link down: it reaches nothing and nothing reaches it.
    func cut(_ i: Int) throws { try Self.run(["link", "set", names.veths[i], "down"]) }

    /// Brings instance `i`'s link back.
    func restore(_ i: Int) throws { try Self.run(["link", "set", names.veths[i], "up"]) }

    /// Stops the relay and removes the namespaces, links and bridge (in reverse order).
    func tearDown() {
        if let relay {
            relay.signal(SIGKILL)
            _ = relay.wait(timeout: 5)
        }
        relay = nil
        for command in created.reversed() { _ = try? Self.run(command) }
        created = []
    }
}
