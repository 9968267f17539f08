/// SHA-256 (FIPS 180-4), small and allocation-light: identifies request bodies for
/// `Idempotency-Key` (a hash an attacker cannot collide, unlike FNV). `hmac` signs webhook
/// deliveries (API.md `X-Opqd-Signature`, with `--webhook-secret`).
/// Checked against the FIPS/NIST test vectors in the tests.
public struct SHA256 {
    private static let k: [UInt32] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
    ]
    private var h: [UInt32] = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]
    private var pending: [UInt8] = []
    private var length: UInt64 = 0

    public init() { pending.reserveCapacity(64) }

    public mutating func update(_ bytes: some Sequence<UInt8>) {
        let done: Void? = bytes.withContiguousStorageIfAvailable { update(buffer: $0) }
        if done == nil { update(buffer: Array(bytes)) }
    }

    private mutating func update(buffer array: [UInt8]) {
        array.withUnsafeBufferPointer { update(buffer: $0) }
    }

    /// Whole 64-byte blocks straight from the caller's memory: per-byte appends made hashing a
    /// 100 KiB body cost ~70 ms in a debug build.
    private mutating func update(buffer: UnsafeBufferPointer<UInt8>) {
        length &+= UInt64(buffer.count)
        var i = 0
        if !pending.isEmpty {
            while i < buffer.count && pending.count < 64 { pending.append(buffer[i]); i += 1 }
            if pending.count == 64 {
                pending.withUnsafeBufferPointer { block($0.baseAddress!) }
                pending.removeAll(keepingCapacity: true)
            }
        }
        if let base = buffer.baseAddress {
            while buffer.count - i >= 64 { block(base + i); i += 64 }
        }
        while i < buffer.count { pending.append(buffer[i]); i += 1 }
    }

    public mutating func finish() -> [UInt8] {
        let bits = length &* 8
        var tail = pending
        tail.append(0x80)
        while tail.count % 64 != 56 { tail.append(0) }
        for i in (0..<8).reversed() { tail.append(UInt8(truncatingIfNeeded: bits >> (UInt64(i) * 8))) }
        tail.withUnsafeBufferPointer { t in
            var at = 0
            while at < t.count { block(t.baseAddress! + at); at += 64 }
        }
        var out: [UInt8] = []
        out.reserveCapacity(32)
        for v in h { for s in [24, 16, 8, 0] as [UInt32] { out.append(UInt8(truncatingIfNeeded: v >> s)) } }
        return out
    }

    private mutating func block(_ p: UnsafePointer<UInt8>) {
        withUnsafeTemporaryAllocation(of: UInt32.self, capacity: 64) { w in
            for i in 0..<16 {
                w[i] = UInt32(p[i &* 4]) << 24 | UInt32(p[i &* 4 &+ 1]) << 16 | UInt32(p[i &* 4 &+ 2]) << 8 | UInt32(p[i &* 4 &+ 3])
            }
            for i in 16..<64 {
                let a = w[i &- 15], b = w[i &- 2]
                let s0 = a.rotr(7) ^ a.rotr(18) ^ (a >> 3)
                let s1 = b.rotr(17) ^ b.rotr(19) ^ (b >> 10)
                w[i] = w[i &- 16] &+ s0 &+ w[i &- 7] &+ s1
            }
            Self.k.withUnsafeBufferPointer { k in
                var (a, b, c, d, e, f, g, hh) = (h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7])
                for i in 0..<64 {
                    let t1 = hh &+ (e.rotr(6) ^ e.rotr(11) ^ e.rotr(25)) &+ ((e & f) ^ (~e & g)) &+ k[i] &+ w[i]
                    let t2 = (a.rotr(2) ^ a.rotr(13) ^ a.rotr(22)) &+ ((a & b) ^ (a & c) ^ (b & c))
                    (hh, g, f, e, d, c, b, a) = (g, f, e, d &+ t1, c, b, a, t1 &+ t2)
                }
                h[0] &+= a; h[1] &+= b; h[2] &+= c; h[3] &+= d; h[4] &+= e; h[5] &+= f; h[6] &+= g; h[7] &+= hh
            }
        }
    }

    /// The digest of `bytes`.
    public static func hash(_ bytes: some Sequence<UInt8>) -> [UInt8] {
        var s = SHA256()
        s.update(bytes)
        return s.finish()
    }

    /// HMAC-SHA256 (RFC 2104) of `message` with `key`.
    public static func hmac(key: [UInt8], message: some Sequence<UInt8>) -> [UInt8] {
        var k = key.count > 64 ? hash(key) : key
        k += [UInt8](repeating: 0, count: 64 - k.count)
        var inner = SHA256()
        inner.update(k.map { $0 ^ 0x36 })
        inner.update(message)
        var outer = SHA256()
        outer.update(k.map { $0 ^ 0x5c })
        outer.update(inner.finish())
        return outer.finish()
    }

    /// Lowercase hexadecimal, two digits a byte.
    public static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for b in bytes { out.append(digits[Int(b >> 4)]); out.append(digits[Int(b & 15)]) }
        return String(decoding: out, as: UTF8.self)
    }
}

extension UInt32 {
    @inline(__always) fileprivate func rotr(_ n: UInt32) -> UInt32 { (self >> n) | (self << (32 - n)) }
}
