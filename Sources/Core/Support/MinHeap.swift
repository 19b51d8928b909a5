/// An element of a `MinHeap`: `isBefore` is a strict order (deadlines, then
/// submission order, for the timer heaps).
protocol HeapOrdered {
    func isBefore(_ other: Self) -> Bool
}

/// A binary min-heap in an array: O(log n) push and pop of the first
/// element. Spindle's timer structures use it: the delay thread's
/// (`DelayedWork`) and the event reactor's (`TimerQueue`). Not thread-safe;
/// its owner guards it.
struct MinHeap<Element: HeapOrdered> {
    private var elements: [Element] = []

    var first: Element? { elements.first }
    var isEmpty: Bool { elements.isEmpty }

    mutating func push(_ element: Element) {
        elements.append(element)
        var i = elements.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            guard elements[i].isBefore(elements[parent]) else { break }
            elements.swapAt(i, parent)
            i = parent
        }
    }

    /// Removes and returns the first element. The heap must not be empty.
    mutating func popFirst() -> Element {
        let first = elements[0]
        let last = elements.removeLast()
        guard !elements.isEmpty else { return first }
        elements[0] = last
        var i = 0
        while true {
            let left = 2 * i + 1, right = left + 1
            var smallest = i
            if left < elements.count && elements[left].isBefore(elements[smallest]) { smallest = left }
            if right < elements.count && elements[right].isBefore(elements[smallest]) { smallest = right }
            if smallest == i { break }
            elements.swapAt(i, smallest)
            i = smallest
        }
        return first
    }

    mutating func removeAll() { elements.removeAll() }
}
