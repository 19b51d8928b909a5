/// Where a process-wide descriptor (the signals' eventfd, an inotify
/// instance, the clock-change timerfd) is watched:
/// the pool's poller, for sources on work queues, or the reactor's loop,
/// for sources on loops and for the driver's own timers.
enum ProcessWideHome: Sendable {
    case pool(PoolPoller)
    case loop(ThreadLoop)
}

/// A descriptor of a process-wide registry: made with the registry's first
/// source and kept for the rest of the process, watched for readability at
/// its home while the registry has sources (`watch` / `unwatch`). Guarded
/// by its registry's lock.
struct ProcessWideDescriptor {
    /// The descriptor; -1 until `watch` made it.
    private(set) var fd: Int32 = -1
    private var watcher: Watcher?

    private enum Watcher {
        case loop(LoopSource)
        case pool(PoolPoller, PoolPoller.State, token: UInt64)
    }

    /// Makes the descriptor with `make` if there is none, and watches it at
    /// `home` unless it is watched already: `readable` then runs (on the
    /// loop's thread, or on the pool worker that holds the poller) each time
    /// it is readable, and must read it. Returns the descriptor. Throws what
    /// `make` throws, or the poller's refusal.
    mutating func watch(
        at home: ProcessWideHome, _ make: () throws(EventSourceError) -> Int32,
        readable: @escaping @Sendable () -> Void
    ) throws(EventSourceError) -> Int32 {
        if fd < 0 { fd = try make() }
        if watcher != nil { return fd }
        switch home {
        case .loop(let loop):
            let source = LoopSource(descriptor: fd) { _, _ in readable() }
            watcher = .loop(source)
            loop.add(source)
        case .pool(let poller):
            do throws(DescriptorWatchError) {
                // Persistent: the holder re-arms it after each report, so no
                // owner has to come back for it.
                let (state, token) = try poller.register(fd, for: .readable, persistent: true) { event in
                    if event.failure == nil { readable() }
                }
                watcher = .pool(poller, state, token: token)
            } catch {
                throw .watchFailed(error)
            }
        }
        return fd
    }

    /// Stops watching the descriptor (its registry has no source left); it
    /// stays open for the next `watch`. On the pool this lets the poller go
    /// unheld when nothing else is watched.
    mutating func unwatch() {
        switch watcher {
        case .loop(let source): source.invalidate()
        case .pool(let poller, let state, let token): poller.deregister(token, in: state)
        case nil: break
        }
        watcher = nil
    }

    /// In a child after `fork()`: the descriptor is the parent's open file
    /// too, so it is forgotten (not closed), and its watch left alone (its
    /// teardown would act on the parent's reactor or epoll instance); the
    /// child's next `watch` makes a new one.
    mutating func childAfterFork() {
        if case .loop(let source) = watcher { _ = Unmanaged.passRetained(source) }
        watcher = nil
        fd = -1
    }
}
