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
    // @unchecked: `place` and `stopped` are guarded by `lock`; the other
    // stored properties are immutable, or touched only by the source's
    // calls, which never overlap (`atEnd`).

    let descriptor: Int32
    let writing: Bool
    let fileType: UInt32
    /// A regular file or directory: always ready.
    let alwaysReady: Bool

    private let lock = GuardLock()
    /// Where the kernel watch lives: a loop's source (the target's loop, or
    /// the reactor's), or a registration with the standard pool's poller,
    /// which an idle worker waits on (see `PoolPoller`).
    private enum Place {
        case loop(ThreadLoop, [LoopMode], LoopSource)
        case pool(PoolPoller, PoolPoller.State, token: UInt64)
    }
    private var place: Place?
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

    func start(for source: EventSource, at placement: WatchPlacement) {
        if alwaysReady {
            source.noteEvent()
            return
        }
        arm(for: source, at: placement)
    }

    /// Makes the kernel watch at `placement`.
    private func arm(for source: EventSource, at placement: WatchPlacement) {
        let interest: Readiness = writing ? .writable : .readable
        if case .pool(let poller) = placement {
            // Registered under the lock, so that a report that comes at once
            // finds `place` set when its handler returns and re-arms.
            let failure: DescriptorWatchError? = lock.withLock {
                guard !stopped else { return nil }
                do throws(DescriptorWatchError) {
                    let (state, token) = try poller.register(descriptor, for: interest) { event in
                        if let failure = event.failure { source.fail(.watchFailed(failure)) } else { source.noteEvent() }
                    }
                    place = .pool(poller, state, token: token)
                    return nil
                } catch {
                    return error
                }
            }
            if let failure { source.fail(.watchFailed(failure)) }
            return
        }
        let loop: ThreadLoop, modes: [LoopMode]
        do throws(EventSourceError) {
            guard let found = try placement.loopAndModes() else { return }
            (loop, modes) = found
        } catch {
            source.fail(error)
            return
        }
        let loopSource = LoopSource(
            descriptor: descriptor, interest: interest, rearmsManually: true,
            failed: { _, error in source.fail(.watchFailed(error)) }
        ) { _, _ in source.noteEvent() }
        let kept: Bool = lock.withLock {
            guard !stopped else { return false }
            place = .loop(loop, modes, loopSource)
            return true
        }
        if kept { for mode in modes { loop.add(loopSource, forMode: mode) } }
    }

    private func rearm() {
        switch lock.withLock({ place }) {
        case .loop(let loop, _, let loopSource): loop.rearm(loopSource)
        case .pool(let poller, let state, let token): poller.rearm(token, in: state)
        case nil: break
        }
    }

    /// Ends the kernel watch where it is (`stop`, `move`).
    private static func leave(_ place: Place?) {
        switch place {
        case .loop(_, _, let loopSource): loopSource.invalidate()
        case .pool(let poller, let state, let token): poller.deregister(token, in: state)
        case nil: break
        }
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

    func move(for source: EventSource, to placement: WatchPlacement) {
        if alwaysReady { return }
        let old: Place? = lock.withLock {
            defer { place = nil }
            return place
        }
        Self.leave(old)
        if !atEnd.load(ordering: .relaxed) { arm(for: source, at: placement) }
    }

    var placementName: String? {
        switch lock.withLock({ place }) {
        case .loop(let loop, _, _): EventReactor.existingLoop() === loop ? "reactor" : "loop"
        case .pool: "pool"
        case nil: nil
        }
    }

    func stop() {
        let old: Place? = lock.withLock {
            stopped = true
            defer { place = nil }
            return place
        }
        Self.leave(old)
    }
}
