// The baseline of the Worker benchmark: a Worker that only forwards each request
// to UPSTREAM_URL, with no limiter. Served by serve.mjs when SCRIPT=passthrough.
export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    return fetch(env.UPSTREAM_URL + url.pathname + url.search, request);
  },
};
