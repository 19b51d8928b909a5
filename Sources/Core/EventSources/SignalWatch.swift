import CShims

/// The watch of a signal source. Signals are process-wide, so one registry
/// serves every signal source: the first source of a signal installs
/// Spindle's observer for it (`cshims_signal_watch_install`: a `sigaction`
/// handler that counts the delivery, writes one eventfd, and then does what
/// the replaced disposition meant), and the last one to be cancelled puts
/// the saved disposition back. The eventfd is watched on the reactor; when
/// it is readable, each source gets the deliveries of its signal counted
/// since it last looked.
///
/// No signal mask is touched (signalfd would need the signal blocked in
/// every thread, which a library cannot arrange for threads it did not
/// make), so any thread may take the signal.
final class SignalWatch: SourceWatch, @unchecked Sendable {
    // @unchecked: `seen`, `source` and `registered` are guarded by the
    // registry's lock.

    let signal: Int32
    /// The observer's count when this source last looked.
    fileprivate var seen: UInt64 = 0
    fileprivate weak var source: EventSource?
    fileprivate var registered = false
    /// Set by `stop`: a `start` that comes after it (a cancel racing the
    /// activation) registers nothing.
    fileprivate var stopped = false

    init(signal: Int32) { self.signal = signal }

    var isProcessWide: Bool { true }

    static func validate(_ signal: Int32) throws(EventSourceError) {
        switch cshims_signal_watch_refusal(signal) {
        case 0: return
        case 2: throw .signalNotObservable(signal, reason: "the C library reserves it for its own threads")
        case 3: throw .signalNotObservable(signal, reason: "SIGKILL and SIGSTOP cannot be caught")
        case 4: throw .signalNotObservable(signal, reason: "it reports a fault of the thread that raised it (SIGILL, SIGBUS, SIGSEGV, SIGFPE), which an observer cannot handle later on another thread")
        default: throw .signalNotObservable(signal, reason: "it is not a signal number (1 to 64)")
        }
    }

    func start(for source: EventSource, at placement: WatchPlacement) {
        do throws(EventSourceError) {
            try Registry.shared.add(self, for: source)
        } catch {
            source.fail(error)
        }
    }

    func move(for source: EventSource, to placement: WatchPlacement) {}

    func stop() { Registry.shared.remove(self) }

    /// Every signal source of the process.
    final class Registry: @unchecked Sendable {
        // @unchecked: everything is guarded by `lock`.

        static let shared = Registry()

        private let lock = GuardLock()
        private var eventfd = ReactorDescriptor()
        private var watches: [Int32: [SignalWatch]] = [:]

        func add(_ watch: SignalWatch, for source: EventSource) throws(EventSourceError) {
            // The reactor first: starting it takes the reactor's lock, which
            // is never taken inside this one.
            let reactor = try EventReactor.loop()
            lock.lock()
            defer { lock.unlock() }
            guard !watch.stopped else { return }
            let fd = try eventfd.open(on: reactor, EventSourceCalls.eventfd) { [unowned self] in self.deliver() }
            if watches[watch.signal, default: []].isEmpty {
                try EventSourceCalls.installSignalObserver(watch.signal, eventfd: fd)
            }
            watch.source = source
            watch.seen = EventSourceCalls.signalCount(watch.signal)
            watch.registered = true
            watches[watch.signal, default: []].append(watch)
        }

        func remove(_ watch: SignalWatch) {
            lock.lock()
            defer { lock.unlock() }
            watch.stopped = true
            guard watch.registered else { return }
            watch.registered = false
            watches[watch.signal]?.removeAll { $0 === watch }
            if watches[watch.signal]?.isEmpty ?? false {
                watches[watch.signal] = nil
                EventSourceCalls.restoreSignal(watch.signal)
            }
        }

        /// On the reactor, when the eventfd is readable: hands each source
        /// the deliveries of its signal since it last looked. The eventfd is
        /// drained first, so a signal counted after the counts are read
        /// writes it again and is delivered on the next round.
        private func deliver() {
            let fd = lock.withLock { eventfd.fd }
            EventSourceCalls.drainEventfd(fd)
            var due: [(EventSource, UInt64)] = []
            lock.withLock {
                for (signal, list) in watches {
                    let count = EventSourceCalls.signalCount(signal)
                    for watch in list where count != watch.seen {
                        if let source = watch.source { due.append((source, count &- watch.seen)) }
                        watch.seen = count
                    }
                }
            }
            for (source, count) in due { source.add(count) }
        }

        /// In a child after `fork()`: the parent's sources are not the
        /// child's, and the eventfd is shared with the parent. The observers
        /// stay installed (and keep chaining to the saved dispositions); the
        /// child's first signal source makes a new eventfd, which they then
        /// write.
        func childAfterFork() {
            lock.reinitializeAfterFork()
            eventfd.childAfterFork()
            watches = [:]
        }
    }
}
