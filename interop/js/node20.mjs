// Node.js 20 lacks Promise.withResolvers (it arrived in Node.js 22), which
// it-queue, a dependency of libp2p's peer store, calls. This module defines
// it as the specification does; client.mjs imports it before anything else.
if (typeof Promise.withResolvers !== 'function') {
  Object.defineProperty(Promise, 'withResolvers', {
    configurable: true,
    writable: true,
    value: function withResolvers () {
      let resolve, reject
      const promise = new this((res, rej) => { resolve = res; reject = rej })
      return { promise, resolve, reject }
    }
  })
}
