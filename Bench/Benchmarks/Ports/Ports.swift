// Ports: a message round trip (A → B → A), Spindle's LocalPort between two
// loop threads, NamedPort between two processes and NetworkPort over
// loopback TCP (a request and its reply), NetworkPort in Foundation's SocketPort wire format (one-way messages
// each way between two loop threads, as SocketPort must do it) beside Foundation's SocketPort (the only port
// Foundation has on Linux: TCP over loopback, each side a RunLoop thread) and the kernel's plainest
// two-way channel, a Unix socketpair read and written by two blocking
// threads.
//
// Every row: thread A waits for the benchmark's go, then makes the batch of
// round trips itself (send a 16-byte message to B, wait for B's answer),
// then reports the batch done; B answers each message it receives. So the
// benchmark thread's own hand-off is paid once per batch. 16 bytes because
// Foundation's SocketPort drops messages under 12 bytes. CPU time per round
// trip is reported beside the wall time (the loops spin briefly before they
// sleep, which the CPU column shows).
import Benchmark
import BenchSupport
import Dispatch
import Foundation
import Spindle

#if canImport(Glibc)
import Glibc
#endif

/// A thread that runs a batch of round trips whenever the benchmark asks.
/// `setUp` runs once on the new thread; `roundTrip` runs there per message.
final class Driver: @unchecked Sendable {
    // @unchecked: `count` is written before `go` is signalled and read after
    // (the semaphore orders it); the thread is otherwise private.
    private let go = DispatchSemaphore(value: 0)
    private let done = DispatchSemaphore(value: 0)
    private var count = 0

    init(setUp: @escaping @Sendable () -> (() -> Void)) {
        let ready = DispatchSemaphore(value: 0)
        let thread = Thread { [self] in
            let roundTrip = setUp()
            ready.signal()
            while true {
                go.wait()
                for _ in 0..<count { roundTrip() }
                done.signal()
            }
        }
        thread.start()
        ready.wait()
    }

    func run(_ n: Int) {
        count = n
        go.signal()
        done.wait()
    }
}

let payload = [UInt8](repeating: 0x5a, count: 16)

/// LocalPort: B is a loop thread whose port answers on each message's reply
/// port; A runs its own loop until the answer has been handled.
func localPortDriver(_ kind: EventBackendKind) -> Driver {
    let b = try! LoopThread.start(backend: kind)
    let server = LocalPort { m in
        try! m.replyPort!.send(PortEnvelope(id: m.id, components: m.components), timeout: .seconds(10))
    }
    b.loop.add(server)
    return Driver {
        let loop = try! ThreadLoop.current(backend: kind)
        let answered = LockedValue(false)
        let mine = LocalPort { _ in answered.withLock { $0 = true } }
        loop.add(mine)
        let message = PortEnvelope(id: 1, components: [.bytes(payload)], replyPort: mine)
        return {
            try! server.send(message, timeout: .seconds(10))
            while !answered.withLock({ $0 }) {
                loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true)
            }
            answered.withLock { $0 = false }
        }
    }
}

/// The TCP port number a SocketPort listens on (its address is a sockaddr_in).
func portNumber(_ port: SocketPort) -> UInt16 {
    let address = port.address
    return UInt16(address[2]) << 8 | UInt16(address[3])
}

/// B's delegate: sends each message's components back to A's port.
final class SocketPortEcho: NSObject, PortDelegate, @unchecked Sendable {
    // @unchecked: `reply` is set before B's loop handles any message and
    // only used on B's thread.
    var reply: SocketPort?
    func handle(_ message: PortMessage) {
        _ = reply?.send(
            before: Date(timeIntervalSinceNow: 10), msgid: Int(message.msgid),
            components: NSMutableArray(array: message.components ?? []), from: nil, reserved: 0)
    }
}

/// A's delegate: counts answers.
final class SocketPortSink: NSObject, PortDelegate, @unchecked Sendable {
    // @unchecked: used on A's thread only.
    var answers = 0
    func handle(_ message: PortMessage) { answers += 1 }
}

/// Foundation's SocketPort: B is a RunLoop thread with a listening port; A
/// has one too, and B answers to it (Foundation on Linux does not carry the
/// sender's reply port, so B is told A's port up front).
func socketPortDriver() -> Driver {
    let bReady = DispatchSemaphore(value: 0)
    let echo = SocketPortEcho()
    nonisolated(unsafe) var bNumber: UInt16 = 0
    // nonisolated(unsafe): written by B before `bReady` is signalled, read after.
    let b = Thread {
        let port = SocketPort(tcpPort: 0)!
        port.setDelegate(echo)
        port.schedule(in: RunLoop.current, forMode: .default)
        bNumber = portNumber(port)
        bReady.signal()
        while true { _ = RunLoop.current.run(mode: .default, before: .distantFuture) }
    }
    b.start()
    bReady.wait()
    let serverNumber = bNumber
    return Driver {
        let port = SocketPort(tcpPort: 0)!
        let sink = SocketPortSink()
        port.setDelegate(sink)
        port.schedule(in: RunLoop.current, forMode: .default)
        // B takes its answer port before it can get a message: set it now,
        // before A sends anything.
        echo.reply = SocketPort(remoteWithTCPPort: portNumber(port), host: "127.0.0.1")!
        let server = SocketPort(remoteWithTCPPort: serverNumber, host: "127.0.0.1")!
        let data = NSData(bytes: payload, length: payload.count)
        return {
            let before = sink.answers
            _ = server.send(
                before: Date(timeIntervalSinceNow: 10), msgid: 1, components: NSMutableArray(array: [data]),
                from: port, reserved: 0)
            let deadline = Date(timeIntervalSinceNow: 10)
            while sink.answers == before && Date() < deadline {
                _ = RunLoop.current.run(mode: .default, before: deadline)
            }
        }
    }
}

/// A Unix socketpair: B blocks in read and writes the bytes back; A writes
/// and blocks in read.
func socketpairDriver() -> Driver {
    var fds: [Int32] = [0, 0]
    precondition(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0, "socketpair failed: \(errno)")
    let (a, b) = (fds[0], fds[1])
    let echo = Thread {
        var buffer = [UInt8](repeating: 0, count: payload.count)
        while true {
            var got = 0
            while got < buffer.count {
                let n = buffer.withUnsafeMutableBytes { read(b, $0.baseAddress! + got, $0.count - got) }
                precondition(n > 0, "socketpair echo: read failed")
                got += n
            }
            _ = buffer.withUnsafeBytes { write(b, $0.baseAddress!, $0.count) }
        }
    }
    echo.start()
    return Driver {
        var buffer = [UInt8](repeating: 0, count: payload.count)
        return {
            _ = payload.withUnsafeBytes { write(a, $0.baseAddress!, $0.count) }
            var got = 0
            while got < buffer.count {
                let n = buffer.withUnsafeMutableBytes { read(a, $0.baseAddress! + got, $0.count - got) }
                precondition(n > 0, "socketpair driver: read failed")
                got += n
            }
        }
    }
}

/// NamedPort between two processes: a forked child publishes a port whose
/// loop (of `kind`) answers each request; A looks the name up and makes
/// requests (`RemotePort.sendRequest`, which waits for the reply in
/// `ppoll`). The child is forked when the benchmarks are registered, before
/// this process starts threads of its own (a child forked while another
/// thread holds a lock may wait for it forever), and exits when this
/// process does. Returns the port's name.
func startNamedPortServer(_ kind: EventBackendKind) -> String {
    let name = "bench.\(getpid()).\(kind)"
    var ready: [Int32] = [0, 0]
    precondition(pipe(&ready) == 0, "pipe failed: \(errno)")
    let parent = getpid()
    let child = fork()
    if child == 0 {
        let server = try! NamedPort(name: name) { m in PortEnvelope(id: m.id, components: m.components) }
        let thread = try! LoopThread.start(backend: kind)
        thread.loop.add(server)
        var b: UInt8 = 1
        _ = write(ready[1], &b, 1)
        while getppid() == parent { sleep(1) }
        _exit(0)
    }
    precondition(child > 0, "fork failed: \(errno)")
    var b: UInt8 = 0
    precondition(read(ready[0], &b, 1) == 1, "the NamedPort server process did not start")
    return name
}

func remotePortDriver(_ connect: @escaping @Sendable () -> RemotePort) -> Driver {
    Driver {
        let server = connect()
        let message = PortEnvelope(id: 1, components: [.bytes(payload)])
        return {
            _ = try! server.sendRequest(message, timeout: .seconds(10), replyTimeout: .seconds(10))
        }
    }
}

/// NetworkPort over loopback TCP: B is a loop thread with the listening
/// port; A connects and makes requests.
func networkPortDriver(_ kind: EventBackendKind) -> Driver {
    let b = try! LoopThread.start(backend: kind)
    let server = try! NetworkPort { m in PortEnvelope(id: m.id, components: m.components) }
    b.loop.add(server)
    let port = server.port
    return remotePortDriver { try! RemotePort.connect(host: "127.0.0.1", port: port) }
}

/// NetworkPort in Foundation's SocketPort wire format, shaped as the
/// SocketPort row: B is a loop thread whose port sends each message back
/// to A's port (told up front: the format carries no reply port); A runs its
/// own loop until the answer has been handled.
func foundationFormatDriver(_ kind: EventBackendKind) -> Driver {
    let b = try! LoopThread.start(backend: kind)
    let answerTo = LockedValue<RemotePort?>(nil)
    let server = try! NetworkPort(wireFormat: .foundationSocketPort) { m in
        try! answerTo.withLock { $0 }!.send(PortEnvelope(id: m.id, components: m.components), timeout: .seconds(10))
        return nil
    }
    b.loop.add(server)
    let serverNumber = server.port
    return Driver {
        let loop = try! ThreadLoop.current(backend: kind)
        let answered = LockedValue(false)
        let mine = try! NetworkPort(wireFormat: .foundationSocketPort) { _ in
            answered.withLock { $0 = true }
            return nil
        }
        loop.add(mine)
        answerTo.withLock {
            $0 = try! RemotePort.connect(host: "127.0.0.1", port: mine.port, wireFormat: .foundationSocketPort)
        }
        let toServer = try! RemotePort.connect(host: "127.0.0.1", port: serverNumber, wireFormat: .foundationSocketPort)
        let message = PortEnvelope(id: 1, components: [.bytes(payload)])
        return {
            try! toServer.send(message, timeout: .seconds(10))
            while !answered.withLock({ $0 }) {
                loop.run(mode: .default, timeout: .seconds(10), returnAfterSourceHandled: true)
            }
            answered.withLock { $0 = false }
        }
    }
}

// MARK: One-way throughput by message size

/// A thread that sends batches of one-way messages whenever the benchmark
/// asks; `setUp` runs once on it and returns the batch's body (send `n`
/// messages and wait until the receiver has taken the last).
final class BatchDriver: @unchecked Sendable {
    // @unchecked: `count` is written before `go` is signalled and read after.
    private let go = DispatchSemaphore(value: 0)
    private let done = DispatchSemaphore(value: 0)
    private var count = 0

    init(setUp: @escaping @Sendable () -> ((Int) -> Void)) {
        let ready = DispatchSemaphore(value: 0)
        let thread = Thread { [self] in
            let batch = setUp()
            ready.signal()
            while true {
                go.wait()
                batch(count)
                done.signal()
            }
        }
        thread.start()
        ready.wait()
    }

    func run(_ n: Int) {
        count = n
        go.signal()
        done.wait()
    }
}

/// LocalPort: n messages of `size` bytes to a port on a loop thread, then
/// an empty one (id 2) that tells the driver the receiver has taken them all
/// (a port delivers in send order).
func localPortBatch(_ size: Int) -> BatchDriver {
    let receiver = try! LoopThread.start()
    let finished = DispatchSemaphore(value: 0)
    let port = LocalPort { m in if m.id == 2 { finished.signal() } }
    receiver.loop.add(port)
    return BatchDriver {
        let message = PortEnvelope(id: 1, components: [.bytes([UInt8](repeating: 1, count: size))])
        return { n in
            for _ in 0..<n { try! port.send(message, timeout: .seconds(10)) }
            try! port.send(PortEnvelope(id: 2), timeout: .seconds(10))
            finished.wait()
        }
    }
}

/// NamedPort or NetworkPort: n one-way messages, then an empty request,
/// whose reply means every message before it was handled.
func remotePortBatch(_ size: Int, _ connect: @escaping @Sendable () -> RemotePort) -> BatchDriver {
    BatchDriver {
        let server = connect()
        let message = PortEnvelope(id: 1, components: [.bytes([UInt8](repeating: 1, count: size))])
        let last = PortEnvelope(id: 3)
        return { n in
            for _ in 0..<n { try! server.send(message, timeout: .seconds(10)) }
            _ = try! server.sendRequest(last, timeout: .seconds(10), replyTimeout: .seconds(30))
        }
    }
}

/// A Unix socketpair: the batch's byte count first, then n × size bytes;
/// the reader answers one byte when it has read them all.
func socketpairBatch(_ size: Int) -> BatchDriver {
    var fds: [Int32] = [0, 0]
    precondition(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0, "socketpair failed: \(errno)")
    let (a, b) = (fds[0], fds[1])
    return streamBatch(writer: a, reader: b, size, label: "socketpair")
}

// MARK: Values between threads of one process

/// What the value rows carry: a small Sendable struct with a heap part,
/// as a job or an event between threads would be.
struct SampleValue: Sendable {
    let id: Int
    let label: String
}

/// LocalValuePort: n values to a port on a loop thread, then one (id -1)
/// that tells the driver the receiver has taken them all (a port delivers
/// in send order).
func localValuePortBatch() -> BatchDriver {
    let receiver = try! LoopThread.start()
    let finished = DispatchSemaphore(value: 0)
    let port = LocalValuePort<SampleValue> { v in if v.id < 0 { finished.signal() } }
    port.schedule(in: receiver.loop)
    return BatchDriver {
        let value = SampleValue(id: 1, label: "a value between threads")
        return { n in
            for _ in 0..<n { try! port.send(value, timeout: .seconds(10)) }
            try! port.send(SampleValue(id: -1, label: ""), timeout: .seconds(10))
            finished.wait()
        }
    }
}

/// AsyncStream: n values yielded to a stream a task iterates (on Swift's
/// global executor), then one (id -1) that signals the driver.
func asyncStreamBatch() -> BatchDriver {
    let (stream, continuation) = AsyncStream.makeStream(of: SampleValue.self, bufferingPolicy: .unbounded)
    let finished = DispatchSemaphore(value: 0)
    Task.detached {
        for await v in stream where v.id < 0 { finished.signal() }
    }
    return BatchDriver {
        let value = SampleValue(id: 1, label: "a value between threads")
        return { n in
            for _ in 0..<n { continuation.yield(value) }
            continuation.yield(SampleValue(id: -1, label: ""))
            finished.wait()
        }
    }
}

/// A serial Dispatch queue: each value handed off in a block, then a block
/// that signals the driver.
func dispatchHandOffBatch() -> BatchDriver {
    let queue = DispatchQueue(label: "bench.values")
    let finished = DispatchSemaphore(value: 0)
    let received = LockedValue(0)
    return BatchDriver {
        let value = SampleValue(id: 1, label: "a value between threads")
        return { n in
            for _ in 0..<n { queue.async { if value.id > 0 { received.withLock { $0 += 1 } } } }
            queue.async { finished.signal() }
            finished.wait()
        }
    }
}

/// Plain TCP over loopback, the yardstick for NetworkPort: a
/// blocking socket pair on 127.0.0.1 (both ends TCP_NODELAY, as
/// NetworkPort's), written and read as `socketpairBatch` does: the batch's
/// byte count, then n × size bytes from one buffer; the reader reads into a
/// 1 MiB buffer and answers one byte when it has read them all.
func tcpLoopbackBatch(_ size: Int) -> BatchDriver {
    let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    precondition(listener >= 0, "socket failed: \(errno)")
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { p in
            bind(listener, p, length) == 0 && listen(listener, 1) == 0 && getsockname(listener, p, &length) == 0
        }
    }
    precondition(bound, "bind/listen on 127.0.0.1 failed: \(errno)")
    let a = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(a, $0, length) == 0 }
    }
    precondition(connected, "connect to 127.0.0.1 failed: \(errno)")
    let b = accept(listener, nil, nil)
    precondition(b >= 0, "accept failed: \(errno)")
    close(listener)
    var one: Int32 = 1
    for fd in [a, b] { _ = setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size)) }
    return streamBatch(writer: a, reader: b, size, label: "TCP")
}

/// The batch protocol over a connected byte stream (`writer` to `reader`):
/// the batch's byte count first, then n × size bytes from one buffer; a
/// thread reads them into a 1 MiB buffer and answers one byte when it has
/// read them all. `label` names the stream in failures.
func streamBatch(writer a: Int32, reader b: Int32, _ size: Int, label: String) -> BatchDriver {
    let reader = Thread {
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        func readExactly(_ count: Int) {
            var left = count
            while left > 0 {
                let n = buffer.withUnsafeMutableBytes { read(b, $0.baseAddress!, min($0.count, left)) }
                precondition(n > 0, "\(label) reader: read failed")
                left -= n
            }
        }
        while true {
            readExactly(8)
            let total = buffer.withUnsafeBytes { $0.loadUnaligned(as: Int.self) }
            readExactly(total)
            var ack: UInt8 = 1
            _ = write(b, &ack, 1)
        }
    }
    reader.start()
    return BatchDriver {
        let chunk = [UInt8](repeating: 1, count: size)
        return { n in
            var total = n * size
            _ = withUnsafeBytes(of: &total) { write(a, $0.baseAddress!, 8) }
            for _ in 0..<n {
                var sent = 0
                while sent < size {
                    let w = chunk.withUnsafeBytes { write(a, $0.baseAddress! + sent, size - sent) }
                    precondition(w > 0, "\(label) writer: write failed")
                    sent += w
                }
            }
            var ack: UInt8 = 0
            _ = read(a, &ack, 1)
        }
    }
}

nonisolated(unsafe) var batchDrivers: [String: BatchDriver] = [:]

func batchDriver(_ name: String, _ make: () -> BatchDriver) -> BatchDriver {
    if let d = batchDrivers[name] { return d }
    let d = make()
    batchDrivers[name] = d
    return d
}

nonisolated(unsafe) var drivers: [String: Driver] = [:]
// nonisolated(unsafe): made lazily on the benchmark thread, which runs the
// benchmarks one after another.

func driver(_ name: String, _ make: () -> Driver) -> Driver {
    if let d = drivers[name] { return d }
    let d = make()
    drivers[name] = d
    return d
}

let benchmarks: @Sendable () -> Void = {
    let backends: [EventBackendKind] = EventBackends.ioUringRefusal == nil ? [.ioUring, .epoll] : [.epoll]
    // First, while this process has no threads of Spindle's: the server processes.
    var namedPortNames: [EventBackendKind: String] = [:]
    for kind in backends { namedPortNames[kind] = startNamedPortServer(kind) }
    let settings = RunSettings(
        scalingFactor: .kilo, maxDuration: .seconds(2), maxIterations: 20, warmupIterations: 2,
        reportedMetrics: [.cpuPerOperation])

    var roundTrip: [Implementation] = backends.map { kind in
        let name = kind == .ioUring ? "Spindle.LocalPort.iouring" : "Spindle.LocalPort.epoll"
        return Implementation(name, isReference: false) { benchmark in
            driver(name) { localPortDriver(kind) }.run(benchmark.scaledIterations.count)
        }
    }
    roundTrip += backends.map { kind in
        let name = kind == .ioUring ? "Spindle.NamedPort.iouring 2 processes" : "Spindle.NamedPort.epoll 2 processes"
        let portName = namedPortNames[kind]!
        return Implementation(name, isReference: false) { benchmark in
            driver(name) { remotePortDriver { try! RemotePort.lookup(portName) } }.run(benchmark.scaledIterations.count)
        }
    }
    roundTrip += backends.map { kind in
        let name = kind == .ioUring ? "Spindle.NetworkPort.iouring loopback" : "Spindle.NetworkPort.epoll loopback"
        return Implementation(name, isReference: false) { benchmark in
            driver(name) { networkPortDriver(kind) }.run(benchmark.scaledIterations.count)
        }
    }
    roundTrip += backends.map { kind in
        let name = kind == .ioUring ? "Spindle.NetworkPort.iouring Foundation format" : "Spindle.NetworkPort.epoll Foundation format"
        return Implementation(name, isReference: false) { benchmark in
            driver(name) { foundationFormatDriver(kind) }.run(benchmark.scaledIterations.count)
        }
    }
    roundTrip.append(.reference("Foundation.SocketPort") { benchmark in
        driver("Foundation.SocketPort", socketPortDriver).run(benchmark.scaledIterations.count)
    })
    roundTrip.append(.peer("Unix socketpair") { benchmark in
        driver("Unix socketpair", socketpairDriver).run(benchmark.scaledIterations.count)
    })
    sideBySide(group: "ports.roundtrip 16B", settings: settings, implementations: roundTrip)

    // One-way throughput: per message, by size. Plain TCP over loopback is
    // the reference (NetworkPort's yardstick, issue 35), the kernel's
    // socketpair a peer (Foundation's SocketPort drops frames over 32 KiB
    // and crashes on bursts, so it cannot be measured this way).
    let namedPortName = namedPortNames[backends[0]]!
    for (label, size, perIteration) in [("16B", 16, 1_000), ("4KiB", 4 << 10, 1_000), ("64KiB", 64 << 10, 200), ("256KiB", 256 << 10, 50), ("1MiB", 1 << 20, 20)] {
        let batchSettings = RunSettings(
            scalingFactor: .one, maxDuration: .seconds(1), maxIterations: 50, warmupIterations: 2,
            reportedMetrics: [.cpuPerOperation], operationsPerIteration: perIteration)
        let key = "\(label)"
        sideBySide(group: "ports.oneway \(label)", settings: batchSettings, implementations: [
            Implementation("Spindle.LocalPort", isReference: false) { _ in
                batchDriver("LocalPort \(key)") { localPortBatch(size) }.run(perIteration)
            },
            Implementation("Spindle.NamedPort 2 processes", isReference: false) { _ in
                batchDriver("NamedPort \(key)") { remotePortBatch(size) { try! RemotePort.lookup(namedPortName) } }.run(perIteration)
            },
            Implementation("Spindle.NetworkPort loopback", isReference: false) { _ in
                batchDriver("NetworkPort \(key)") {
                    let receiver = try! LoopThread.start()
                    let server = try! NetworkPort { m in m.id == 3 ? PortEnvelope(id: 3) : nil }
                    receiver.loop.add(server)
                    let port = server.port
                    return remotePortBatch(size) { try! RemotePort.connect(host: "127.0.0.1", port: port) }
                }.run(perIteration)
            },
            .peer("Unix socketpair") { _ in
                batchDriver("socketpair \(key)") { socketpairBatch(size) }.run(perIteration)
            },
            .reference("TCP loopback") { _ in
                batchDriver("TCP \(key)") { tcpLoopbackBatch(size) }.run(perIteration)
            },
        ])
    }

    // A Sendable value from one thread to another in the same process, one
    // way: LocalValuePort beside LocalPort (16 bytes) and the peers a user
    // would pick instead, an AsyncStream and a serial Dispatch queue.
    let valueSettings = RunSettings(
        scalingFactor: .one, maxDuration: .seconds(1), maxIterations: 50, warmupIterations: 2,
        reportedMetrics: [.cpuPerOperation], operationsPerIteration: 1_000)
    sideBySide(group: "ports.values oneway", settings: valueSettings, implementations: [
        Implementation("Spindle.LocalValuePort", isReference: false) { _ in
            batchDriver("LocalValuePort") { localValuePortBatch() }.run(1_000)
        },
        Implementation("Spindle.LocalPort 16B", isReference: false) { _ in
            batchDriver("LocalPort 16B") { localPortBatch(16) }.run(1_000)
        },
        .peer("AsyncStream") { _ in
            batchDriver("AsyncStream") { asyncStreamBatch() }.run(1_000)
        },
        .reference("DispatchQueue.async") { _ in
            batchDriver("DispatchQueue.async") { dispatchHandOffBatch() }.run(1_000)
        },
    ])
}
