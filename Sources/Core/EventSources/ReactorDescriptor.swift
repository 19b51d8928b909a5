/// The descriptor of a process-wide registry (the signals' eventfd, the
/// inotify instance, the clock-change timerfd), watched on the reactor:
/// made with the registry's first source and kept for the rest of the
/// process. Guarded by its registry's lock.
struct ReactorDescriptor {
    /// The descriptor; -1 until `open`.
    private(set) var fd: Int32 = -1
    private var watcher: LoopSource?

    /// Makes the descriptor with `make` and watches it on `reactor`, where
    /// `readable` runs each time it is readable; once made, returns it.
    mutating func open(
        on reactor: ThreadLoop, _ make: () throws(EventSourceError) -> Int32,
        readable: @escaping @Sendable () -> Void
    ) throws(EventSourceError) -> Int32 {
        if fd >= 0 { return fd }
        let made = try make()
        let source = LoopSource(descriptor: made) { _, _ in readable() }
        fd = made
        watcher = source
        reactor.add(source)
        return made
    }

    /// In a child after `fork()`: the descriptor is the parent's open file
    /// too, so it is forgotten (not closed), and its loop source left alone
    /// (its teardown would act on the parent's reactor); the child's next
    /// `open` makes a new one.
    mutating func childAfterFork() {
        if let watcher { _ = Unmanaged.passRetained(watcher) }
        watcher = nil
        fd = -1
    }
}
