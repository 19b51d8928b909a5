import Synchronization

/// The watch of a read or write source: a descriptor source on a loop that
/// the loop does not re-arm by itself. When the descriptor becomes ready the
/// kernel watch ends (the event layer's registrations are one-shot), so a
/// level-triggered descriptor does not wake the loop again while the call
/// is pending or the source suspended; it is re-armed after the handler
/// returns. Together with the source's coalescing this is level-triggered
/// delivery without a flood and without concurrent calls.
///
/// A regular file or a directory cannot be waited on (epoll refuses it;
/// it is always ready), so such a watch delivers at once and again after
/// each call, until end of file for a read source.
final class DescriptorWatch: SourceWatch, @unchecked Sendable {
    // @unchecked: `place` and `loopSource` are guarded by `lock`; the other
    // stored properties are immutable, or touched only by the source's
    // calls, which never overlap (`atEnd`).

    let descriptor: Int32
    let writing: Bool
    let fileType: UInt32
    /// A regular file or directory: always ready.
    let alwaysReady: Bool

    private let lock = GuardLock()
    private var place: (ThreadLoop, [LoopMode])?
    private var loopSource: LoopSource?
    private var stopped = false
    /// A read source saw end of file: it stays quiet from then on. Written
    /// and read only by the source's calls, which never overlap.
    private let atEnd = Atomic<Bool>(false)

    init(descriptor: Int32, writing: Bool) throws(EventSourceError) {
        require(descriptor >= 0, "EventSource.\(writing ? "write" : "read")(descriptor:): `descriptor` is \(descriptor); it must be an open descriptor")
        let stat = try EventSourceCalls.stat(descriptor)
        self.descriptor = descriptor
        self.writing = writing
        fileType = stat.type
        alwaysReady = stat.type == EventSourceCalls.regularFile || stat.type == EventSourceCalls.directory
    }

    func start(for source: EventSource, on loop: ThreadLoop, modes: [LoopMode]) {
        if alwaysReady {
            source.noteEvent()
            return
        }
        let made = LoopSource(
            descriptor: descriptor, interest: writing ? .writable : .readable, rearmsManually: true,
            failed: { _, error in source.fail(.watchFailed(error)) }
        ) { _, _ in source.noteEvent() }
        lock.withLock {
            guard !stopped else { return }
            loopSource = made
            place = (loop, modes)
        }
        arm()
    }

    private func arm() {
        let (source, place) = lock.withLock { (loopSource, self.place) }
        guard let source, let (loop, modes) = place else { return }
        for mode in modes { loop.add(source, forMode: mode) }
    }

    private func rearm() {
        let (source, place) = lock.withLock { (loopSource, self.place) }
        guard let source, let (loop, _) = place else { return }
        loop.rearm(source)
    }

    private func leave() {
        let (source, place) = lock.withLock { (loopSource, self.place) }
        guard let source, let (loop, modes) = place else { return }
        for mode in modes { loop.remove(source, forMode: mode) }
    }

    func take(for source: EventSource) -> UInt64? {
        if writing {
            if let space = EventSourceCalls.writeSpace(descriptor, type: fileType) { return UInt64(space) }
            return 1
        }
        let available: Int64
        if fileType == EventSourceCalls.regularFile {
            let size = (try? EventSourceCalls.stat(descriptor).size) ?? 0
            available = max(0, size - (EventSourceCalls.offset(descriptor) ?? size))
        } else if fileType == EventSourceCalls.directory {
            available = 1
        } else {
            available = EventSourceCalls.readableBytes(descriptor) ?? 1
            // Nothing queued: end of file if the descriptor still polls
            // readable (a hang-up); otherwise a report that an earlier call
            // already consumed (a move between loops), with nothing to say.
            if available == 0 && !EventSourceCalls.isReadableNow(descriptor) {
                rearm()
                return nil
            }
        }
        if available == 0 { atEnd.store(true, ordering: .relaxed) }
        return UInt64(available)
    }

    func handlerReturned(for source: EventSource) {
        if !writing && atEnd.load(ordering: .relaxed) { return }
        if alwaysReady {
            source.noteEvent()
        } else {
            rearm()
        }
    }

    func move(for source: EventSource, to loop: ThreadLoop, modes: [LoopMode]) {
        if alwaysReady { return }
        leave()
        lock.withLock { if !stopped { place = (loop, modes) } }
        if !atEnd.load(ordering: .relaxed) { arm() }
    }

    func stop() {
        let source = lock.withLock {
            stopped = true
            defer { loopSource = nil; place = nil }
            return loopSource
        }
        source?.invalidate()
    }
}
