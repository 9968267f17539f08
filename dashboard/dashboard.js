// opqd dashboard: plain JavaScript, no build step, no dependencies.
//
// One SSE stream per page (read with fetch(), since EventSource cannot send Authorization),
// resumed with Last-Event-ID after a drop. Events never trigger a full reload: they mark the
// queue (and the open operation) they name as dirty, and each dirty item is re-fetched at most
// once a second, with If-None-Match, batched per animation frame. Lists are cursor-paged.
// Everything inserted into the page goes through textContent or DOM properties, never HTML.
'use strict';

(() => {
  const TOKEN_KEY = 'opqd.token';
  const FROM_NOW = '9223372036854775807';  // ?after= past every seq: the stream starts live
  const STATES = ['pending', 'ready', 'executing', 'paused', 'finished'];
  const PAGE = 50;
  const TAIL_MAX = 100;
  const REFETCH_MS = 1000;
  const VIEWS = ['queues', 'queue', 'op', 'hosts', 'limiters', 'schedules', 'schedule'];

  const $ = (id) => document.getElementById(id);

  const S = {
    token: sessionStorage.getItem(TOKEN_KEY) || '',
    access: null,             // 'write' | 'read'
    started: false,
    everStarted: false,       // a token worked once in this page (a new one reloads it)
    queues: new Map(),        // name -> {data, etag, row, cells}
    queuesRendered: false,
    listEtag: null,           // of GET /v1/queues when it fits one page
    lastSeq: null,            // the last seq seen on the stream
    streamAbort: null,
    dirtyQueues: new Set(),
    fetchedAt: new Map(),     // key -> ms of the last fetch
    inFlight: new Set(),
    frame: 0,
    timer: 0,
    tail: [],
    throughput: new Map(),    // queue -> {sec: Int32Array(60) of epoch seconds, n: Int32Array(60)}
    view: {name: 'queues'},
    list: null,               // the open operations list: {queue, state, prefix, next, rows: Map}
    op: null,                 // the open operation: {id, data, etag, events: Set of seq, next}
    opDirty: false,
    dirty: new Map(),         // key -> function that re-reads it (hosts, schedules): at most once a second each
    poll: 0,                  // the open view's own polling timer (hosts, limiters, schedules)
    hosts: null,              // the hosts view: {rows: Map host -> {row, cells, data}, next, etag, pages}
    limiters: null,           // the limiters view: {rows: Map name -> {...}, keysRead: Map name -> {sig, at}}
    scheds: null,             // schedule rows shown (the schedules view or a queue's): {rows: Map 'q/name' -> {...}}
    sched: null,              // the open schedule: {queue, name, etag, data}
    charts: null,             // the history charts shown (the overview's or a queue's), see openCharts
    skew: undefined,          // ms the server's clock is ahead of this browser's
    resumedFrom: null,        // the Last-Event-ID the open stream resumed after
    firstOfStream: false,
  };

  // ---- DOM helpers: text and properties only, nothing is parsed as markup ----
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (v === undefined || v === null || v === false) continue;
        if (k === 'class') e.className = v;
        else if (k === 'text') e.textContent = v;
        else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
        else if (k in e && k !== 'list') e[k] = v;
        else e.setAttribute(k, v === true ? '' : String(v));
      }
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  function setText(node, text) {
    const t = String(text);
    if (node.textContent !== t) node.textContent = t;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
  const seg = (s) => encodeURIComponent(s);
  const canWrite = () => S.access === 'write';

  // ---- the API ----
  class Problem extends Error {
    constructor(status, detail) { super(detail); this.status = status; }
  }

  function headers(extra) {
    const h = Object.assign({Accept: 'application/json'}, extra || {});
    if (S.token) h.Authorization = 'Bearer ' + S.token;
    return h;
  }

  // Resolves to {status, body, etag}; 304 has body null. Throws Problem for 4xx/5xx (401 also
  // brings up the token form).
  async function api(method, path, body, extra) {
    const init = {method, headers: headers(extra), cache: 'no-store'};
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers['Content-Type'] = 'application/json';
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      throw new Problem(0, 'the server could not be reached (' + e.message + ')');
    }
    const etag = res.headers.get('ETag');
    if (S.skew === undefined) {
      // The server's clock against this browser's (a second's precision; ignored below 2 s).
      const date = Date.parse(res.headers.get('Date') || '');
      if (Number.isFinite(date)) S.skew = Math.abs(date - Date.now()) > 2000 ? date - Date.now() : 0;
    }
    if (res.status === 304) return {status: 304, body: null, etag};
    let data = null;
    const text = await res.text();
    if (text) {
      try { data = JSON.parse(text); } catch (_) { data = null; }
    }
    if (res.status === 401) {
      needToken(S.token ? 'The token was refused.' : '');
      throw new Problem(401, (data && data.detail) || 'a token is needed');
    }
    if (!res.ok) {
      const detail = data && (data.detail || data.title);
      throw new Problem(res.status, detail ? String(detail) : 'HTTP ' + res.status);
    }
    return {status: res.status, body: data, etag};
  }

  function notify(message, kind) {
    const box = $('notice');
    box.className = 'notice' + (kind === 'info' ? ' info' : '');
    box.setAttribute('role', kind === 'info' ? 'status' : 'alert');
    setText($('notice-text'), message);
    box.hidden = false;
  }
  function failed(what, e) {
    if (e instanceof Problem && e.status === 401) return;
    notify(what + ' failed: ' + (e instanceof Problem ? (e.status ? e.status + ' ' : '') + e.message : String(e)));
  }

  // ---- start, token ----
  function needToken(message) {
    stopStream();
    S.started = false;
    for (const id of VIEWS.map((v) => 'view-' + v).concat(['tail', 'find-form', 'sections'])) $(id).hidden = true;
    stopPoll();
    $('login').hidden = false;
    $('forget').hidden = !S.token;
    setText($('login-error'), message || '');
    setConn('needs a token', 'down');
    $('login-token').focus();
  }

  async function start() {
    let who;
    try {
      who = await api('GET', '/v1/access');
    } catch (e) {
      if (!(e instanceof Problem && e.status === 401)) {
        setConn('unreachable', 'down');
        notify('Could not reach the server: ' + e.message);
      }
      return;
    }
    S.access = who.body && who.body.access === 'write' ? 'write' : 'read';
    S.started = true;
    $('login').hidden = true;
    $('forget').hidden = !S.token;
    const mode = $('mode');
    mode.hidden = S.access === 'write';
    setText(mode, 'read-only token: actions hidden');
    document.body.classList.toggle('read-only', !canWrite());
    if (!canWrite()) for (const id of ['q-actions', 'op-actions', 'sched-actions', 'confirm']) $(id).remove();
    S.everStarted = true;
    $('tail').hidden = false;
    $('find-form').hidden = false;
    $('sections').hidden = false;
    // The stream first, so no change between the first read and the stream is missed.
    await openStreamOnce();
    await loadQueues();
    route();
    loadCluster();
  }

  // Who serves the API (GET /v1/cluster): shown in the header, details on hover.
  async function loadCluster() {
    let r;
    try { r = await api('GET', '/v1/cluster'); } catch (e) { return; }
    const c = r.body || {};
    const list = Array.isArray(c.instances) ? c.instances : [];
    const el = $('cluster');
    const n = list.length;
    // In a cluster, which instance owns the queues (it changes at a takeover: re-read below).
    const owner = list.find((i) => i.owner === true);
    setText(el, n + (n === 1 ? ' instance' : ' instances') + ' · ' + String(c.store || '') + ' · ' + String(c.mode || '') +
      (owner ? ' · owner ' + String(owner.url) + ' (epoch ' + String(owner.epoch) + ')' : ''));
    el.title = list.map((i) => String(i.url) + ' (' + String(i.id) + (i.owner ? ', owner' : '') + (i.self ? ', answering' : '') +
      '), heartbeat ' + String(i.heartbeatAt) + ', ' + (Array.isArray(i.queues) ? i.queues.length : 0) + ' queues').join('\n');
    el.hidden = false;
    if (!S.clusterTimer) S.clusterTimer = setInterval(loadCluster, 5000);
  }

  // ---- the stream ----
  function setConn(text, cls) {
    const c = $('conn');
    setText(c, text);
    c.className = 'conn' + (cls ? ' ' + cls : '');
  }

  function stopStream() {
    if (S.streamAbort) S.streamAbort.abort();
    S.streamAbort = null;
  }

  let streamReady = null;
  function openStreamOnce() {
    // Resolves once the stream answered (or failed); the loop keeps it open afterwards.
    return new Promise((resolve) => {
      streamReady = resolve;
      streamLoop();
      setTimeout(resolve, 3000);
    });
  }

  async function streamLoop() {
    stopStream();
    const abort = new AbortController();
    S.streamAbort = abort;
    let delay = 500;
    while (!abort.signal.aborted) {
      const h = headers({Accept: 'text/event-stream'});
      let url = '/v1/events/stream';
      const resumed = S.lastSeq !== null;
      if (resumed) h['Last-Event-ID'] = String(S.lastSeq);
      else url += '?after=' + FROM_NOW;
      try {
        const res = await fetch(url, {headers: h, cache: 'no-store', signal: abort.signal});
        if (res.status === 401) { needToken('The token was refused.'); return; }
        if (res.status === 410) {
          // The events after our cursor are gone: start from now, and once that stream is open
          // re-read what is shown (below), so nothing between the two is missed.
          S.lastSeq = null;
          setConn('resynchronising', 'down');
          continue;
        }
        if (!res.ok || !res.body) throw new Error('HTTP ' + res.status);
        setConn('live', 'live');
        S.resumedFrom = resumed ? S.lastSeq : null;
        S.firstOfStream = true;
        if (streamReady) { streamReady(); streamReady = null; } else if (!resumed) refreshAll();
        delay = 500;
        await readEvents(res.body);
      } catch (e) {
        if (abort.signal.aborted) return;
      }
      if (streamReady) { streamReady(); streamReady = null; }
      setConn('reconnecting…', 'down');
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 5000);
    }
  }

  // Server-Sent Events, parsed by hand: `id:`, `event:`, `data:` lines, a blank line ends one.
  async function readEvents(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    let id = null, event = 'message', data = [];
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return;
      buf += value;
      let start = 0, nl;
      while ((nl = buf.indexOf('\n', start)) >= 0) {
        let line = buf.slice(start, nl);
        start = nl + 1;
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (line === '') {
          if (data.length) dispatch(id, event, data.join('\n'));
          id = null; event = 'message'; data = [];
          continue;
        }
        if (line[0] === ':') continue;
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let val = colon < 0 ? '' : line.slice(colon + 1);
        if (val[0] === ' ') val = val.slice(1);
        if (field === 'id') id = val;
        else if (field === 'event') event = val;
        else if (field === 'data') data.push(val);
      }
      buf = buf.slice(start);
    }
  }

  function dispatch(id, event, data) {
    let ev;
    try { ev = JSON.parse(data); } catch (_) { return; }
    const seq = Number(id !== null ? id : ev.seq);
    if (S.firstOfStream) {
      S.firstOfStream = false;
      // Resumed after N, the server only sends seqs above N, unless it lost its history (a
      // --store memory server restarted): then its seqs start over, and what is shown is stale.
      if (S.resumedFrom !== null && seq <= S.resumedFrom) {
        S.lastSeq = null;
        refreshAll();
      }
    }
    if (Number.isFinite(seq)) {
      if (S.lastSeq !== null && seq <= S.lastSeq) return;
      S.lastSeq = seq;
    }
    if (event !== 'change' && event !== 'message') return;
    onChange(ev);
  }

  // ---- live updates ----
  function onChange(ev) {
    if (typeof ev.host === 'string' && S.hosts) {
      const host = ev.host;
      markDirty('h:' + host, () => refreshHost(host));
    }
    if (typeof ev.queue === 'string' && S.scheds && S.scheds.queues.has(ev.queue)) {
      // A run of a schedule is an operation of its queue: its events re-read that queue's schedules.
      const queue = ev.queue;
      markDirty('sq:' + queue, () => refreshQueueSchedules(queue));
    }
    chartEvent(ev);
    if (typeof ev.queue === 'string') {
      S.dirtyQueues.add(ev.queue);
      if (ev.key === 'isFinished' && ev.new === true) countFinished(ev.queue);
    }
    if (S.op && ev.operation === S.op.id) {
      S.opDirty = true;
      addOpEvent(ev, true);
    }
    if (S.list && S.list.rows.has(ev.operation) && typeof ev.state === 'string') {
      const cell = S.list.rows.get(ev.operation);
      setText(cell, ev.state);
    } else if (S.list && ev.queue === S.list.queue) {
      S.list.missed++;
    }
    S.tail.push(ev);
    if (S.tail.length > TAIL_MAX) S.tail.splice(0, S.tail.length - TAIL_MAX);
    schedule();
  }

  function schedule(delay) {
    if (delay) {
      if (!S.timer) S.timer = setTimeout(() => { S.timer = 0; schedule(); }, delay);
      return;
    }
    if (!S.frame) S.frame = requestAnimationFrame(flush);
  }

  function due(key, now) {
    const last = S.fetchedAt.get(key) || 0;
    return now - last >= REFETCH_MS ? 0 : REFETCH_MS - (now - last);
  }

  function flush() {
    S.frame = 0;
    renderTail();
    if (document.hidden) return;  // caught up on visibilitychange
    const now = performance.now();
    let wait = 0;
    // Many dirty queues: one list read is cheaper than a request each.
    if (S.inFlight.has('*')) {
      // The whole list is being read; its answer reschedules what is still dirty.
    } else if (S.dirtyQueues.size > 8) {
      const w = due('*', now);
      if (w === 0) {
        S.fetchedAt.set('*', now);
        S.dirtyQueues.clear();
        loadQueues().catch(() => {});
      } else wait = w;
    } else {
      for (const name of Array.from(S.dirtyQueues)) {
        const key = 'q:' + name;
        if (S.inFlight.has(key)) continue;
        const w = due(key, now);
        if (w > 0) { wait = wait ? Math.min(wait, w) : w; continue; }
        S.dirtyQueues.delete(name);
        S.fetchedAt.set(key, now);
        refreshQueue(name);
      }
    }
    if (S.opDirty && S.op && !S.inFlight.has('op')) {
      const w = due('op', now);
      if (w === 0) {
        S.opDirty = false;
        S.fetchedAt.set('op', now);
        refreshOp();
      } else wait = wait ? Math.min(wait, w) : w;
    }
    for (const [key, fn] of Array.from(S.dirty)) {
      if (S.inFlight.has(key)) continue;
      const w = due(key, now);
      if (w > 0) { wait = wait ? Math.min(wait, w) : w; continue; }
      S.dirty.delete(key);
      S.fetchedAt.set(key, now);
      S.inFlight.add(key);
      Promise.resolve(fn()).catch(() => {}).finally(() => {
        S.inFlight.delete(key);
        if (S.dirty.has(key)) schedule();
      });
    }
    const cw = chartsTick(now);
    if (cw) wait = wait ? Math.min(wait, cw) : cw;
    if (S.list && S.list.missed) {
      setText($('q-list-note'), S.list.missed.toLocaleString('en') + ' change(s) to operations not in this list since it was read; press Show to re-read it.');
    }
    if (wait) schedule(wait);
  }

  function markDirty(key, fn) {
    S.dirty.set(key, fn);
    schedule();
  }

  async function refreshQueue(name) {
    const key = 'q:' + name;
    S.inFlight.add(key);
    const known = S.queues.get(name);
    try {
      const r = await api('GET', '/v1/queues/' + seg(name), undefined,
        known && known.etag ? {'If-None-Match': known.etag} : undefined);
      if (r.status !== 304) upsertQueue(r.body, r.etag);
    } catch (e) {
      if (e instanceof Problem && e.status === 404) {
        removeQueue(name);
        if (S.view.name === 'queue' && S.view.queue === name) setText($('q-summary'), 'There is no queue named ' + name + '.');
      }
    } finally {
      S.inFlight.delete(key);
      // Events that came while it was in flight wait for this answer, not for another event.
      if (S.dirtyQueues.has(name)) schedule();
    }
  }

  async function refreshAll() {
    if (S.charts) readCharts(S.charts, true);
    await loadQueues().catch(() => {});
    if (S.op) refreshOp();
  }

  // ---- throughput: finishes seen live in the last 60 s, per queue ----
  function countFinished(queue) {
    let t = S.throughput.get(queue);
    if (!t) { t = {sec: new Float64Array(60), n: new Int32Array(60)}; S.throughput.set(queue, t); }
    const s = Math.floor(Date.now() / 1000);
    const i = s % 60;
    if (t.sec[i] !== s) { t.sec[i] = s; t.n[i] = 0; }
    t.n[i]++;
    const entry = S.queues.get(queue);
    if (entry) setText(entry.cells.rate, perMinute(queue));
  }
  function perMinute(queue) {
    const t = S.throughput.get(queue);
    if (!t) return 0;
    const s = Math.floor(Date.now() / 1000);
    let sum = 0;
    for (let i = 0; i < 60; i++) if (s - t.sec[i] < 60) sum += t.n[i];
    return sum;
  }

  // ---- queues ----
  async function loadQueues() {
    S.inFlight.add('*');
    try {
      let after = null;
      const seen = new Set();
      for (let pages = 0; pages < 1000; pages++) {
        // A one-page list is revalidated with its ETag, where the server gives one.
        const tag = !after && S.listEtag ? {'If-None-Match': S.listEtag} : undefined;
        const r = await api('GET', '/v1/queues' + (after ? '?after=' + seg(after) : ''), undefined, tag);
        if (r.status === 304) return;
        if (!after) S.listEtag = r.body && !r.body.next ? r.etag : null;
        const list = (r.body && r.body.queues) || [];
        for (const q of list) { seen.add(q.name); upsertQueue(q, null); }
        markRendered();
        after = r.body && r.body.next;
        if (!after) break;
      }
      for (const name of Array.from(S.queues.keys())) if (!seen.has(name)) removeQueue(name);
    } catch (e) {
      failed('Reading the queues', e);
    } finally {
      S.inFlight.delete('*');
      markRendered();
      if (S.dirtyQueues.size) schedule();
    }
  }

  function markRendered() {
    if (S.queuesRendered) return;
    S.queuesRendered = true;
    updateQueuesSummary();
    performance.mark('opqd-queues-rendered');
    document.body.dataset.queuesRendered = 'true';
  }

  function updateQueuesSummary() {
    setText($('queues-count'), '(' + S.queues.size + ')');
    $('queues-empty').hidden = S.queues.size > 0;
  }

  function queueRow(name) {
    const link = el('a', {href: '#/q/' + seg(name), text: name});
    const cells = {};
    const tr = el('tr', {'data-queue': name});
    tr.append(el('th', {scope: 'row'}, link));
    for (const st of STATES) {
      cells[st] = el('td', {class: 'num' + (st === 'paused' ? ' opt' : ''), 'data-state': st});
      tr.append(cells[st]);
    }
    cells.conc = el('td', {class: 'num opt'});
    cells.rate = el('td', {class: 'num opt'});
    cells.state = el('td');
    cells.badge = el('span', {class: 'badge'});
    cells.state.append(cells.badge);
    tr.append(cells.conc, cells.rate, cells.state);
    const act = el('td', {class: 'act-col'});
    if (canWrite()) {
      cells.toggle = el('button', {type: 'button', class: 'q-toggle'});
      cells.toggle.addEventListener('click', () => toggleSuspend(name));
      act.append(cells.toggle);
    }
    tr.append(act);
    return {row: tr, cells};
  }

  function upsertQueue(q, etag) {
    if (!q || typeof q.name !== 'string') return;
    let entry = S.queues.get(q.name);
    if (!entry) {
      entry = Object.assign({data: q, etag}, queueRow(q.name));
      S.queues.set(q.name, entry);
      insertSorted(entry.row, q.name);
      updateQueuesSummary();
    }
    entry.data = q;
    if (etag) entry.etag = etag;
    else if (entry.etag && entry.revision !== q.revision) entry.etag = null;
    entry.revision = q.revision;
    const c = entry.cells;
    const counts = q.counts || {};
    for (const st of STATES) {
      const n = counts[st] || 0;
      setText(c[st], n.toLocaleString('en'));
      c[st].classList.toggle('zero', n === 0);
    }
    const limit = q.effectiveMaxConcurrentOperationCount ?? q.maxConcurrentOperationCount;
    setText(c.conc, (counts.executing || 0) + ' / ' + limit);
    setText(c.rate, perMinute(q.name));
    setText(c.badge, q.isSuspended ? 'suspended' : 'active');
    c.badge.className = 'badge' + (q.isSuspended ? ' suspended' : '');
    if (c.toggle) {
      setText(c.toggle, q.isSuspended ? 'Resume' : 'Suspend');
      c.toggle.setAttribute('aria-label', (q.isSuspended ? 'Resume ' : 'Suspend ') + q.name);
    }
    if (S.view.name === 'queue' && S.view.queue === q.name) renderQueueHeader(q);
  }

  function insertSorted(row, name) {
    const body = $('queues-body');
    for (const tr of body.children) {
      if (tr.dataset.queue > name) { body.insertBefore(row, tr); return; }
    }
    body.append(row);
  }

  function removeQueue(name) {
    const entry = S.queues.get(name);
    if (!entry) return;
    entry.row.remove();
    S.queues.delete(name);
    updateQueuesSummary();
  }

  function refreshRates() {
    for (const [name, entry] of S.queues) setText(entry.cells.rate, perMinute(name));
  }

  // ---- confirmation ----
  function confirmAction(text, withCascade) {
    const dlg = $('confirm');
    setText($('confirm-text'), text);
    $('confirm-cascade-row').hidden = !withCascade;
    $('confirm-cascade').checked = false;
    const back = document.activeElement;
    return new Promise((resolve) => {
      const done = () => {
        dlg.removeEventListener('close', done);
        if (back && back.focus) back.focus();
        resolve(dlg.returnValue === 'yes' ? {cascade: $('confirm-cascade').checked} : null);
      };
      dlg.returnValue = '';
      dlg.addEventListener('close', done);
      dlg.showModal();
      $('confirm-no').focus();
    });
  }

  // ---- queue actions ----
  async function toggleSuspend(name) {
    const entry = S.queues.get(name);
    const suspended = entry && entry.data.isSuspended;
    if (!suspended) {
      const ok = await confirmAction('Suspend queue ' + name + '? Executing operations run on; no new one starts until it is resumed.');
      if (!ok) return;
    }
    try {
      const r = await api('POST', '/v1/queues/' + seg(name) + (suspended ? '/resume' : '/suspend'));
      upsertQueue(r.body, r.etag);
    } catch (e) {
      failed((suspended ? 'Resuming ' : 'Suspending ') + name, e);
    }
  }

  // ---- views (the URL fragment: #/, #/q/NAME, #/q/NAME/s/SCHEDULE, #/op/ID, #/hosts,
  // #/limiters, #/schedules) ----
  function route() {
    if (!S.started) return;
    const parts = location.hash.replace(/^#\/?/, '').split('/');
    let name = 'queues', arg = null, arg2 = null;
    try {
      if (parts[0] === 'q' && parts[1] && parts[2] === 's' && parts[3]) {
        name = 'schedule'; arg = decodeURIComponent(parts[1]); arg2 = decodeURIComponent(parts[3]);
      } else if (parts[0] === 'q' && parts[1]) { name = 'queue'; arg = decodeURIComponent(parts[1]); }
      else if (parts[0] === 'op' && parts[1]) { name = 'op'; arg = decodeURIComponent(parts[1]); }
      else if (parts[0] === 'hosts' || parts[0] === 'limiters' || parts[0] === 'schedules') name = parts[0];
    } catch (_) { name = 'queues'; }
    for (const v of VIEWS) $('view-' + v).hidden = v !== name;
    const section = {queue: 'queues', schedule: 'schedules'}[name] || name;
    for (const a of $('sections').querySelectorAll('a')) {
      if (a.dataset.view === section) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
    stopPoll();
    S.dirty.clear();
    if (name === 'queues') openCharts(null, $('overview-charts'));
    else if (name !== 'queue') closeCharts();
    if (name !== 'op') S.op = null;
    if (name !== 'queue') S.list = null;
    S.hosts = null;
    S.limiters = null;
    S.scheds = null;
    S.sched = null;
    if (name === 'queue') {
      S.view = {name, queue: arg};
      openQueue(arg);
    } else if (name === 'op') {
      S.view = {name, id: arg};
      openOp(arg);
    } else if (name === 'schedule') {
      S.view = {name, queue: arg, schedule: arg2};
      openSchedule(arg, arg2);
    } else {
      S.view = {name};
      if (name === 'hosts') openHosts();
      else if (name === 'limiters') openLimiters();
      else if (name === 'schedules') openSchedules();
    }
  }

  // The open view's own re-reads (what has no event, like a host's held count or a limiter's
  // keys): every `ms` while the tab is visible, stopped when the view changes.
  function startPoll(fn, ms) {
    stopPoll();
    S.poll = setInterval(() => { if (!document.hidden) fn(); }, ms);
  }
  function stopPoll() {
    if (S.poll) clearInterval(S.poll);
    S.poll = 0;
  }

  function renderQueueHeader(q) {
    setText($('q-name'), q.name);
    const badge = $('q-state');
    setText(badge, q.isSuspended ? 'suspended' : 'active');
    badge.className = 'badge' + (q.isSuspended ? ' suspended' : '');
    const c = q.counts || {};
    const limit = q.effectiveMaxConcurrentOperationCount ?? q.maxConcurrentOperationCount;
    setText($('q-summary'), STATES.map((s) => s + ' ' + (c[s] || 0).toLocaleString('en')).join(' · ') +
      ' · running ' + (c.executing || 0) + ' of ' + limit);
    if ($('q-suspend')) {
      $('q-suspend').hidden = q.isSuspended;
      $('q-resume').hidden = !q.isSuspended;
      const input = $('q-conc');
      if (document.activeElement !== input) input.value = String(q.maxConcurrentOperationCount);
    }
  }

  function openQueue(name) {
    const entry = S.queues.get(name);
    setText($('q-name'), name);
    if (entry) renderQueueHeader(entry.data);
    else refreshQueue(name);
    $('q-filter-state').value = '';
    $('q-search').value = '';
    loadOps(name, '', '', true);
    openQueueSchedules(name);
    openCharts(name, $('q-charts'));
  }

  async function loadOps(queue, state, prefix, reset) {
    if (reset) {
      S.list = {queue, state, prefix, next: null, rows: new Map(), missed: 0};
      clear($('ops-body'));
      setText($('q-list-note'), 'Loading…');
    }
    const list = S.list;
    if (!list) return;
    const q = new URLSearchParams();
    if (list.state) q.set('state', list.state);
    if (list.prefix) q.set('namePrefix', list.prefix);
    q.set('limit', String(PAGE));
    if (list.next) q.set('after', list.next);
    $('ops-more').hidden = true;
    try {
      const r = await api('GET', '/v1/queues/' + seg(queue) + '/operations?' + q.toString());
      if (S.list !== list) return;
      const ops = (r.body && r.body.operations) || [];
      const body = $('ops-body');
      const frag = document.createDocumentFragment();
      for (const op of ops) frag.append(opRow(op, list));
      body.append(frag);
      list.next = (r.body && r.body.next) || null;
      $('ops-more').hidden = !list.next;
      setText($('q-list-note'), list.rows.size === 0 ? 'No operations match.' :
        'Showing ' + list.rows.size.toLocaleString('en') + (list.next ? ' (more below)' : ''));
    } catch (e) {
      if (S.list !== list) return;
      setText($('q-list-note'), '');
      failed('Listing operations', e);
    }
  }

  function opRow(op, list) {
    const state = el('td', {text: op.state + (op.outcome ? ' (' + op.outcome + ')' : '')});
    list.rows.set(op.id, state);
    return el('tr', {'data-op': op.id},
      el('td', null, el('a', {href: '#/op/' + seg(op.id), class: 'mono', text: op.id})),
      el('td', {text: op.name || ''}),
      el('td', {class: 'opt', text: op.kind || ''}),
      state,
      el('td', {class: 'opt', text: op.queuePriority || ''}),
      el('td', {class: 'num opt', text: op.attempt ?? ''}),
      el('td', {class: 'opt', text: op.createdAt || ''}));
  }

  const OP_ID = /^op-[0-9a-f]{16}$/;

  async function find(event) {
    event.preventDefault();
    const text = $('find-id').value.trim();
    if (!OP_ID.test(text)) { notify('An operation id looks like op- and 16 hex digits; got "' + text + '".'); return; }
    try {
      await api('GET', '/v1/operations/' + seg(text));
      $('notice').hidden = true;
      location.hash = '#/op/' + seg(text);
    } catch (e) {
      failed('Looking up ' + text, e);
    }
  }

  async function search(event) {
    event.preventDefault();
    const name = S.view.queue;
    if (!name) return;
    const text = $('q-search').value.trim();
    const state = $('q-filter-state').value;
    // An id opens that operation; anything else is a name prefix.
    if (OP_ID.test(text)) {
      try {
        const r = await api('GET', '/v1/operations/' + seg(text));
        if (r.body && r.body.id) { location.hash = '#/op/' + seg(r.body.id); return; }
      } catch (e) {
        if (!(e instanceof Problem && e.status === 404)) { failed('Looking up ' + text, e); return; }
      }
    }
    loadOps(name, state, text, true);
  }

  // ---- one operation ----
  function openOp(id) {
    S.op = {id, data: null, etag: null, seqs: new Set(), next: null};
    setText($('op-id'), id);
    setText($('op-state'), '');
    clear($('op-fields'));
    clear($('op-deps'));
    setText($('op-spec'), '');
    setText($('op-outcome'), '');
    clear($('op-events-body'));
    $('op-events-more').hidden = true;
    refreshOp();
    loadOpEvents();
  }

  async function refreshOp() {
    const op = S.op;
    if (!op) return;
    S.inFlight.add('op');
    try {
      const r = await api('GET', '/v1/operations/' + seg(op.id), undefined, op.etag ? {'If-None-Match': op.etag} : undefined);
      if (S.op !== op || r.status === 304) return;
      op.etag = r.etag;
      renderOp(r.body);
    } catch (e) {
      if (S.op === op) failed('Reading operation ' + op.id, e);
    } finally {
      S.inFlight.delete('op');
      if (S.opDirty) schedule();
    }
  }

  function renderOp(o) {
    if (!o) return;
    S.op.data = o;
    const status = o.state + (o.outcome ? ' (' + o.outcome + ')' : '');
    const badge = $('op-state');
    setText(badge, status);
    badge.className = 'badge ' + (o.outcome || o.state);
    const back = $('op-back');
    back.href = '#/q/' + seg(o.queue);
    setText(back, '← Queue ' + o.queue);
    const fields = $('op-fields');
    clear(fields);
    const add = (k, v) => { if (v !== undefined && v !== null && v !== '') fields.append(el('dt', {text: k}), el('dd', {text: v})); };
    add('Queue', o.queue);
    add('Name', o.name);
    add('Kind', o.kind);
    add('State', status);
    add('Priority', o.queuePriority);
    add('Attempt', o.attempt + (o.retry ? ' of ' + o.retry.maxAttempts : ''));
    if (o.progress) add('Progress', o.progress.completed + ' / ' + o.progress.total + ' (' + Math.round(o.progress.fractionCompleted * 100) + '%)');
    add('Flags', ['isReady', 'isExecuting', 'isFinished', 'isCancelled', 'isPaused'].filter((k) => o[k]).join(', ') || 'none');
    if (o.waitingOn) {
      // Why it is not running (API.md "Why is it not running?"), one line per reason.
      const list = el('ul', {id: 'op-waiting', class: 'waiting'});
      for (const w of o.waitingOn) list.append(waitingItem(w, o));
      if (!o.waitingOn.length) list.append(el('li', {text: o.state === 'executing' ? 'nothing: it is running' : 'nothing: it is next for a slot'}));
      fields.append(el('dt', {text: 'Waiting on'}), el('dd', null, list));
      explainWaiting(o, list);
    }
    if (o.limits) add('Limits', o.limits.map((l) => l.limiter + (l.key ? ' (key ' + l.key + ')' : '')).join(', '));
    add('Fairness key', o.fairnessKey);
    add('Timeout', o.timeout !== undefined ? o.timeout + ' s' : null);
    add('Not before', o.notBefore);
    add('Created', o.createdAt);
    add('Started', o.startedAt);
    add('Finished', o.finishedAt);
    add('Revision', o.revision);
    const deps = $('op-deps');
    clear(deps);
    for (const d of o.dependencies || []) deps.append(el('li', null, el('a', {href: '#/op/' + seg(d), class: 'mono', text: d})));
    if (!deps.firstChild) deps.append(el('li', {class: 'muted', text: 'none'}));
    setText($('op-spec'), o.spec !== undefined ? JSON.stringify(o.spec, null, 2) : '(none)');
    const hasError = o.error !== undefined;
    setText($('op-outcome-title'), hasError ? 'Error' : 'Result');
    setText($('op-outcome'), hasError ? JSON.stringify(o.error, null, 2) :
      o.result !== undefined ? JSON.stringify(o.result, null, 2) : '(none yet)');
    if ($('op-cancel')) {
      const st = o.state;
      $('op-cancel').disabled = st === 'finished';
      $('op-pause').disabled = !(st === 'pending' || st === 'ready' || st === 'executing');
      $('op-resume').disabled = st !== 'paused';
    }
  }

  async function loadOpEvents() {
    const op = S.op;
    if (!op) return;
    $('op-events-more').hidden = true;
    try {
      const r = await api('GET', '/v1/operations/' + seg(op.id) + '/events?limit=100' + (op.next ? '&after=' + op.next : ''));
      if (S.op !== op) return;
      for (const ev of (r.body && r.body.events) || []) addOpEvent(ev, false);
      op.next = r.body && r.body.next;
      $('op-events-more').hidden = !op.next;
    } catch (e) {
      if (S.op === op) failed('Reading the history', e);
    }
  }

  function addOpEvent(ev, live) {
    const op = S.op;
    if (!op || op.seqs.has(ev.seq)) return;
    // Live events are newer than anything loaded; only add them once the history is complete.
    if (live && op.next) return;
    op.seqs.add(ev.seq);
    const fmt = (v) => (v === null || v === undefined ? '–' : typeof v === 'object' ? JSON.stringify(v) : String(v));
    const row = el('tr', null,
      el('td', {class: 'num', text: ev.seq}),
      el('td', {text: ev.time || ''}),
      el('td', {text: ev.key + ': ' + fmt(ev.old) + ' → ' + fmt(ev.new)}),
      el('td', {text: ev.state || ''}));
    $('op-events-body').append(row);
  }

  async function opAction(kind) {
    const op = S.op;
    if (!op) return;
    const id = op.id;
    let path = '/v1/operations/' + seg(id) + '/' + kind;
    let body;
    if (kind === 'cancel') {
      const ok = await confirmAction('Cancel operation ' + id + '?', true);
      if (!ok) return;
      if (ok.cascade) path += '?cascade=true';
    }
    if (kind === 'copy') body = {};
    try {
      const r = await api('POST', path, body);
      if (kind === 'copy' && r.body && r.body.id) {
        notify('Copied to ' + r.body.id + '.', 'info');
        location.hash = '#/op/' + seg(r.body.id);
        return;
      }
      if (S.op === op && r.body) { op.etag = r.etag; renderOp(r.body); }
    } catch (e) {
      failed(kind[0].toUpperCase() + kind.slice(1) + ' of ' + id, e);
    }
  }

  // ---- times: the browser's clock in the browser's zone, how far off, the RFC 3339 text kept ----
  function parseTime(iso) {
    const t = typeof iso === 'string' ? Date.parse(iso) : NaN;
    return Number.isFinite(t) ? t : null;
  }
  function relText(ms) {
    const s = Math.round(ms / 1000);
    const a = Math.abs(s);
    if (a < 1) return 'now';
    const t = a < 90 ? a + ' s' : a < 5400 ? Math.round(a / 60) + ' min' : a < 172800 ? Math.round(a / 3600) + ' h' : Math.round(a / 86400) + ' d';
    return s > 0 ? 'in ' + t : t + ' ago';
  }
  const pad2 = (n) => String(n).padStart(2, '0');
  function clockText(t) {
    const d = new Date(t);
    const hms = pad2(d.getHours()) + ':' + pad2(d.getMinutes()) + ':' + pad2(d.getSeconds());
    if (d.toDateString() === new Date().toDateString()) return hms;
    return d.getFullYear() + '-' + pad2(d.getMonth() + 1) + '-' + pad2(d.getDate()) + ' ' + hms;
  }
  // <time datetime="…"> with "10:00:05 (in 4 s)"; the relative part is kept current by tickTimes.
  function timeNode(iso) {
    const t = parseTime(iso);
    if (t === null) return document.createTextNode(iso === undefined || iso === null ? '–' : String(iso));
    const e = el('time', {dateTime: iso, title: iso});
    e.dataset.rel = '';
    setText(e, clockText(t) + ' (' + relText(t - Date.now()) + ')');
    return e;
  }
  function tickTimes() {
    const now = Date.now();
    for (const e of document.querySelectorAll('time[data-rel]')) {
      const t = parseTime(e.dateTime);
      if (t !== null) setText(e, clockText(t) + ' (' + relText(t - now) + ')');
    }
  }
  const num = (n) => (typeof n === 'number' ? n.toLocaleString('en') : '–');
  function fill(node, ...parts) {
    clear(node);
    for (const p of parts) if (p !== null && p !== undefined) node.append(p instanceof Node ? p : document.createTextNode(String(p)));
  }
  function rateText(r) {
    if (!r) return '–';
    return num(r.perSecond) + '/s, burst ' + num(r.burst);
  }

  // ---- charts: a queue's history (GET /v1/queues/{q}/history) or every queue's (GET /v1/history),
  // drawn as inline SVG by this script ----
  // Two windows, each one request: the last hour at one-minute steps (60 buckets), the last day
  // at one-hour steps (24). Between reads the newest bucket grows from the stream (finishes seen
  // live, whose outcome the next read tells); a read after events asks only from the newest
  // bucket held (`since`), with If-None-Match, at most every CHART_READ_MS.
  const RANGES = [
    {id: 'hour', title: 'Last hour', step: 60, count: 60},
    {id: 'day', title: 'Last day', step: 3600, count: 24},
  ];
  const CHART_READ_MS = 5000;
  const CHART_SLIDE_MS = 60000;
  const LIVE_MAX = 5000;
  const SVGNS = 'http://www.w3.org/2000/svg';

  function svg(tag, attrs, ...children) {
    const e = document.createElementNS(SVGNS, tag);
    if (attrs) for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) e.setAttribute(k, String(v));
    for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }

  // The server's clock, as far as the Date header of its answers tells (to a second): buckets
  // are the server's minutes and hours.
  const serverNow = () => Date.now() + (S.skew || 0);

  // A set of charts for one scope (a queue, or null for all of them) in `box`.
  function openCharts(scope, box) {
    closeCharts();
    clear(box);
    const set = {scope, box, ranges: [], live: [], lastRead: 0, dirty: false, drawn: false};
    const grid = el('div', {class: 'chart-grid'});
    for (const r of RANGES) {
      const fig = el('figure', {class: 'chart', 'data-range': r.id});
      const head = el('figcaption', null, el('strong', {text: r.title}), ' ', el('span', {class: 'muted', text: scope === null ? 'all queues' : ''}));
      const tput = el('div', {class: 'plot plot-tput'});
      const wait = el('div', {class: 'plot plot-wait'});
      const totals = el('p', {class: 'totals'});
      const note = el('p', {class: 'muted chart-note', role: 'status'});
      fig.append(head, el('p', {class: 'plot-label', text: 'Finished per ' + (r.step === 60 ? 'minute' : 'hour')}), tput,
        el('p', {class: 'plot-label', text: 'Wait, ready to executing'}), wait, totals, note);
      grid.append(fig);
      set.ranges.push(Object.assign({fig, tput, wait, totals, note, buckets: new Map(), etag: null, url: null, since: null, failed: false}, r));
    }
    box.append(grid, legend());
    S.charts = set;
    set.resize = new ResizeObserver(() => { if (S.charts === set) requestAnimationFrame(() => drawCharts(set)); });
    set.resize.observe(box);
    set.slide = setInterval(() => { if (!document.hidden) readCharts(set, false); }, CHART_SLIDE_MS);
    readCharts(set, true);
    return set;
  }

  function closeCharts() {
    const set = S.charts;
    if (!set) return;
    set.resize.disconnect();
    clearInterval(set.slide);
    S.charts = null;
  }

  function legend() {
    const swatch = (cls, line) => {
      const s = svg('svg', {class: 'swatch', width: 18, height: 12, 'aria-hidden': 'true', focusable: 'false'});
      s.append(line ? svg('line', {class: cls, x1: 1, y1: 6, x2: 17, y2: 6}) : svg('rect', {class: cls, x: 1, y: 1, width: 16, height: 10}));
      return s;
    };
    return el('ul', {class: 'legend'},
      el('li', null, swatch('bar-ok'), ' succeeded (solid)'),
      el('li', null, swatch('bar-fail'), ' failed (dark stripes)'),
      el('li', null, swatch('bar-live'), ' finished, seen live: outcome at the next read'),
      el('li', null, swatch('line-p95', true), ' wait p95'),
      el('li', null, swatch('line-p50', true), ' wait p50 (dashed)'));
  }

  // The window of a range now: its first bucket's start and the end of the current bucket (s).
  function windowOf(r) {
    const now = Math.floor(serverNow() / 1000);
    const end = (Math.floor(now / r.step) + 1) * r.step;
    return {from: end - r.count * r.step, end};
  }
  const iso = (sec) => new Date(sec * 1000).toISOString();

  async function readCharts(set, full) {
    if (S.charts !== set) return;
    set.lastRead = performance.now();
    set.dirty = false;
    const seq = S.lastSeq;
    const reads = set.ranges.map(async (r) => {
      const {from} = windowOf(r);
      // A full read of the window at first and when it slid past what is held; else from the
      // newest bucket held (the one that grows).
      let since = from;
      if (!full && r.buckets.size) since = Math.max(from, Math.max(...r.buckets.keys()));
      const path = (set.scope === null ? '/v1/history' : '/v1/queues/' + seg(set.scope) + '/history') +
        '?step=' + r.step + '&since=' + encodeURIComponent(iso(since));
      let res;
      try {
        res = await api('GET', path, undefined, r.url === path && r.etag ? {'If-None-Match': r.etag} : undefined);
      } catch (e) {
        if (S.charts !== set) return;
        r.failed = true;
        setText(r.note, e instanceof Problem && e.status === 404 && !r.buckets.size ?
          'No history: ' + e.message : 'Reading the history failed: ' + e.message);
        return;
      }
      if (S.charts !== set) return;
      r.failed = false;
      r.since = since;
      if (res.status === 304) return;
      r.url = path;
      r.etag = res.etag;
      for (const k of Array.from(r.buckets.keys())) if (k >= since || k < from) r.buckets.delete(k);
      for (const b of (res.body && res.body.buckets) || []) {
        const t = parseTime(b.start);
        if (t !== null) r.buckets.set(Math.floor(t / 1000), b);
      }
      r.readFrom = from;
      r.readSince = since;
    });
    await Promise.all(reads);
    if (S.charts !== set) return;
    // Finishes the reads have counted leave the live tally (those seen after the read began stay).
    if (seq !== null) set.live = set.live.filter((x) => x.seq > seq);
    drawCharts(set);
  }

  // A change from the stream: a finish grows the newest bucket at once; a read follows later.
  function chartEvent(ev) {
    const set = S.charts;
    if (!set || (set.scope !== null && ev.queue !== set.scope) || typeof ev.queue !== 'string') return;
    if (ev.key === 'isCancelled' && ev.new === true) set.cancelled = (set.cancelled || new Set()).add(ev.operation);
    if (ev.key === 'isFinished' && ev.new === true) {
      const t = parseTime(ev.time);
      const cancelled = set.cancelled && set.cancelled.delete(ev.operation);
      if (!cancelled && t !== null) {
        set.live.push({seq: Number(ev.seq), sec: Math.floor(t / 1000)});
        if (set.live.length > LIVE_MAX) set.live.splice(0, set.live.length - LIVE_MAX);
      }
    }
    if (set.cancelled && set.cancelled.size > LIVE_MAX) set.cancelled.clear();
    set.dirty = true;
    set.redraw = true;
  }

  // Called from flush(): draws what the stream added (at most once a frame) and reads again
  // when events came and CHART_READ_MS passed.
  function chartsTick(now) {
    const set = S.charts;
    if (!set) return 0;
    if (set.redraw) { set.redraw = false; drawCharts(set); }
    if (!set.dirty) return 0;
    const wait = CHART_READ_MS - (now - set.lastRead);
    if (wait > 0) return wait;
    readCharts(set, false);
    return 0;
  }

  function fmtSeconds(s) {
    if (s === null || s === undefined) return '–';
    if (s < 1) return Math.round(s * 1000) + ' ms';
    if (s < 60) return (s < 10 && s % 1 ? s.toFixed(1) : Math.round(s)) + ' s';
    if (s < 3600) return +(s / 60).toFixed(1) + ' min';
    return (s / 3600).toFixed(1) + ' h';
  }
  // A round duration at or above v seconds, for the wait axis.
  function niceDuration(v) {
    const steps = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200];
    for (const d of steps) if (d >= v) return d;
    return Math.ceil(v / 3600) * 3600;
  }
  // A round count at or above v whose half is whole too (the axis marks 0, half and the top).
  function niceMax(v) {
    if (!(v > 2)) return 2;
    if (v <= 10) return 2 * Math.ceil(v / 2);
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 3, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }
  function clockLabel(sec, withDay) {
    const d = new Date(sec * 1000);
    const hm = pad2(d.getHours()) + ':' + pad2(d.getMinutes());
    return withDay && d.getHours() === 0 && d.getMinutes() === 0 ? (d.getMonth() + 1) + '/' + d.getDate() : hm;
  }

  function drawCharts(set) {
    if (S.charts !== set) return;
    for (const r of set.ranges) drawRange(set, r);
    if (!set.drawn && set.ranges.every((r) => r.since !== null || r.failed)) {
      set.drawn = true;
      if (set.scope === null && !S.overviewMarked) {
        S.overviewMarked = true;
        performance.mark('opqd-overview-rendered');
      }
      document.body.dataset.chartsRendered = set.scope === null ? '*' : set.scope;
    }
  }

  function drawRange(set, r) {
    const {from, end} = windowOf(r);
    const width = Math.max(240, Math.floor(r.fig.clientWidth || 480));
    const left = 46, right = 8, plotW = width - left - right;
    const x = (sec) => left + (sec - from) / (end - from) * plotW;
    const slot = plotW / r.count;
    const live = new Map();
    for (const e of set.live) {
      if (e.sec < from || e.sec >= end) continue;
      const k = Math.floor(e.sec / r.step) * r.step;
      live.set(k, (live.get(k) || 0) + 1);
    }
    const rows = [];
    const sum = {created: 0, started: 0, succeeded: 0, failed: 0, cancelled: 0};
    let peakWait = null;
    for (let k = from; k < end; k += r.step) {
      const b = r.buckets.get(k);
      const row = {k, ok: 0, bad: 0, live: live.get(k) || 0, p95: null, p50: null, b};
      if (b) {
        row.ok = b.succeeded || 0;
        row.bad = b.failed || 0;
        row.p95 = typeof b.waitP95 === 'number' ? b.waitP95 : null;
        row.p50 = typeof b.waitP50 === 'number' ? b.waitP50 : null;
        for (const f of Object.keys(sum)) sum[f] += b[f] || 0;
        if (row.p95 !== null) peakWait = Math.max(peakWait || 0, row.p95);
      }
      rows.push(row);
    }
    const liveTotal = rows.reduce((n, row) => n + row.live, 0);

    // Throughput: succeeded, failed and live finishes stacked per bucket.
    const th = 120, tb = 16, tTop = 8, tPlot = th - tb - tTop;
    const tMax = niceMax(Math.max(0, ...rows.map((row) => row.ok + row.bad + row.live)));
    const tSvg = svg('svg', {class: 'chart-svg', width, height: th, viewBox: '0 0 ' + width + ' ' + th, role: 'img'});
    const tTitle = (set.scope === null ? 'All queues' : 'Queue ' + set.scope) + ', ' + r.title.toLowerCase() + ': operations finished per ' +
      (r.step === 60 ? 'minute' : 'hour') + ': ' + sum.succeeded + ' succeeded, ' + sum.failed + ' failed' +
      (liveTotal ? ', ' + liveTotal + ' more seen finishing' : '');
    tSvg.setAttribute('aria-label', tTitle);
    axes(tSvg, {left, width, top: tTop, plot: tPlot, max: tMax, fmt: (v) => num(v), from, end, r, x});
    const yT = (v) => tTop + tPlot - v / tMax * tPlot;
    const barW = Math.max(1, slot - (slot > 4 ? 1.5 : 0.5));
    for (const row of rows) {
      if (!row.ok && !row.bad && !row.live) continue;
      const g = svg('g', {'data-start': iso(row.k), 'data-succeeded': row.ok, 'data-failed': row.bad, 'data-live': row.live});
      g.append(svg('title', null, clockLabel(row.k) + ': ' + row.ok + ' succeeded, ' + row.bad + ' failed' +
        (row.live ? ', ' + row.live + ' seen finishing' : '') + (row.b ? ', ' + (row.b.cancelled || 0) + ' cancelled' : '')));
      let base = 0;
      for (const [v, cls] of [[row.ok, 'bar-ok'], [row.bad, 'bar-fail'], [row.live, 'bar-live']]) {
        if (!v) continue;
        const y0 = yT(base), y1 = yT(base + v);
        g.append(svg('rect', {class: cls, x: (x(row.k) + 0.25).toFixed(2), y: y1.toFixed(2), width: barW.toFixed(2), height: Math.max(0.5, y0 - y1).toFixed(2)}));
        base += v;
      }
      tSvg.append(g);
    }

    // Wait (ready to executing): p95 as a solid line with points, p50 dashed; gaps where no
    // operation started.
    const wh = 84, wTop = 8, wPlot = wh - tb - wTop;
    const wMax = niceDuration(Math.max(0, ...rows.map((row) => row.p95 || 0)));
    const wSvg = svg('svg', {class: 'chart-svg', width, height: wh, viewBox: '0 0 ' + width + ' ' + wh, role: 'img'});
    wSvg.setAttribute('aria-label', r.title + ': wait p95 ' + (peakWait === null ? 'none' : 'at most ' + fmtSeconds(peakWait)));
    axes(wSvg, {left, width, top: wTop, plot: wPlot, max: wMax, fmt: fmtSeconds, from, end, r, x, label: 'wait'});
    const yW = (v) => wTop + wPlot - v / wMax * wPlot;
    for (const [field, cls] of [['p50', 'line-p50'], ['p95', 'line-p95']]) {
      let d = '', pen = false;
      for (const row of rows) {
        const v = row[field];
        if (v === null) { pen = false; continue; }
        d += (pen ? 'L' : 'M') + (x(row.k) + slot / 2).toFixed(1) + ' ' + yW(v).toFixed(1);
        pen = true;
        if (field === 'p95') {
          wSvg.append(svg('circle', {class: 'dot-p95', cx: (x(row.k) + slot / 2).toFixed(1), cy: yW(v).toFixed(1), r: 2, 'data-start': iso(row.k), 'data-wait': v},
            svg('title', null, clockLabel(row.k) + ': wait p95 ' + fmtSeconds(v) + ', p50 ' + fmtSeconds(row.p50))));
        }
      }
      if (d) wSvg.insertBefore(svg('path', {class: cls, d}), wSvg.querySelector('circle'));
    }
    r.tput.replaceChildren(tSvg);
    r.wait.replaceChildren(wSvg);

    // The numbers: the sums of the buckets read (the stream's finishes apart).
    r.fig.dataset.since = iso(from);
    r.fig.dataset.step = String(r.step);
    clear(r.totals);
    const parts = [['created', 'created'], ['started', 'started'], ['succeeded', 'succeeded'], ['failed', 'failed'], ['cancelled', 'cancelled']];
    parts.forEach(([f, label], i) => {
      if (i) r.totals.append(' · ');
      r.totals.append(label + ' ', el('span', {class: 'total', 'data-total': f, text: num(sum[f])}));
    });
    r.totals.append(' · wait p95 peak ', el('span', {class: 'total', 'data-total': 'waitP95Max', text: fmtSeconds(peakWait)}));
    if (liveTotal) r.totals.append(' · ', el('span', {'data-total': 'live', text: '+' + num(liveTotal) + ' seen finishing since the last read'}));
    if (!r.failed) setText(r.note, r.buckets.size || liveTotal ? '' : 'Nothing happened in this window.');
  }

  // Horizontal grid lines with values, and time labels under the plot.
  function axes(s, o) {
    const ticks = [0, o.max / 2, o.max];
    for (const v of ticks) {
      const y = o.top + o.plot - v / o.max * o.plot;
      s.append(svg('line', {class: 'grid-line', x1: o.left, x2: o.width - 4, y1: y.toFixed(1), y2: y.toFixed(1)}));
      s.append(svg('text', {class: 'tick', x: o.left - 4, y: (y + 4).toFixed(1), 'text-anchor': 'end'}, o.fmt(v)));
    }
    const every = o.r.step === 60 ? 600 : 6 * 3600;
    const offset = new Date().getTimezoneOffset() * 60;  // labels on the browser's round hours
    for (let t = Math.ceil((o.from - offset) / every) * every + offset; t < o.end; t += every) {
      const xx = o.x(t);
      if (xx < o.left + 12 || xx > o.width - 16) continue;
      s.append(svg('line', {class: 'tick-line', x1: xx.toFixed(1), x2: xx.toFixed(1), y1: o.top + o.plot, y2: o.top + o.plot + 3}));
      s.append(svg('text', {class: 'tick', x: xx.toFixed(1), y: o.top + o.plot + 13, 'text-anchor': 'middle'}, clockLabel(t, true)));
    }
  }

  // ---- hosts (GET /v1/hosts, PATCH /v1/hosts/{host}) ----
  const HOST_PAGE = 200;
  const BREAKER_WORDS = {closed: 'closed', open: 'open', halfOpen: 'half-open', ramping: 'ramping'};
  const BREAKER_CLASS = {closed: 'succeeded', open: 'failed', halfOpen: 'paused', ramping: 'executing'};

  function openHosts() {
    S.hosts = {rows: new Map(), next: null, etag: null, pages: 1};
    clear($('hosts-body'));
    setText($('hosts-count'), '');
    loadHosts(false);
    startPoll(() => loadHosts(true), 3000);
  }

  // The first page again (with its ETag, a 304 when nothing changed), or the next one.
  async function loadHosts(poll, more) {
    const h = S.hosts;
    if (!h || S.inFlight.has('hosts')) return;
    S.inFlight.add('hosts');
    try {
      const after = more ? h.next : null;
      const tag = !more && h.etag ? {'If-None-Match': h.etag} : undefined;
      const r = await api('GET', '/v1/hosts?limit=' + HOST_PAGE + (after ? '&after=' + seg(after) : ''), undefined, tag);
      if (S.hosts !== h || r.status === 304) return;
      const list = (r.body && r.body.hosts) || [];
      for (const x of list) upsertHost(x);
      if (more) {
        h.pages++;
        h.next = r.body.next || null;
      } else {
        h.etag = r.etag;
        if (h.pages === 1) {
          // Only the first page is shown: a host left out of it has been forgotten.
          const seen = new Set(list.map((x) => x.host));
          for (const [name, entry] of h.rows) if (!seen.has(name)) { entry.row.remove(); h.rows.delete(name); }
          h.next = r.body.next || null;
        }
      }
      $('hosts-more').hidden = !h.next;
      setText($('hosts-count'), '(' + h.rows.size.toLocaleString('en') + (h.next ? '+' : '') + ')');
      $('hosts-empty').hidden = h.rows.size > 0;
      document.body.dataset.hostsRendered = 'true';
    } catch (e) {
      if (!poll) failed('Reading the hosts', e);
    } finally {
      S.inFlight.delete('hosts');
    }
  }

  async function refreshHost(host) {
    const h = S.hosts;
    if (!h) return;
    const entry = h.rows.get(host);
    if (!entry) { loadHosts(true); return; }
    const r = await api('GET', '/v1/hosts/' + seg(host), undefined, entry.etag ? {'If-None-Match': entry.etag} : undefined);
    if (S.hosts !== h || r.status === 304) return;
    upsertHost(r.body, r.etag);
  }

  function hostRow(name) {
    const cells = {};
    const tr = el('tr', {'data-host': name});
    tr.append(el('th', {scope: 'row', class: 'mono', text: name}));
    cells.state = el('td', {'data-field': 'state'});
    cells.badge = el('span', {class: 'badge'});
    cells.state.append(cells.badge);
    cells.held = el('td', {class: 'num', 'data-field': 'held'});
    cells.failures = el('td', {class: 'num opt', 'data-field': 'consecutiveFailures'});
    cells.trips = el('td', {class: 'num opt', 'data-field': 'trips'});
    cells.until = el('td', {'data-field': 'until'});
    cells.error = el('td', {class: 'opt wrap', 'data-field': 'lastError'});
    tr.append(cells.state, cells.held, cells.failures, cells.trips, cells.until, cells.error);
    const act = el('td', {class: 'act-col'});
    if (canWrite()) {
      for (const [breaker, label] of [['open', 'Open…'], ['closed', 'Close…'], ['auto', 'Auto']]) {
        cells[breaker] = el('button', {type: 'button', class: 'h-' + breaker, text: label, 'aria-label': label.replace('…', '') + ' ' + name});
        cells[breaker].addEventListener('click', () => hostAction(name, breaker));
        act.append(cells[breaker], ' ');
      }
    }
    tr.append(act);
    return {row: tr, cells};
  }

  // When the breaker changes next, in words: an open host's next probe, a ramp's end, a wait
  // the host asked for, or a hold set by hand.
  function hostUntil(x) {
    const parts = [];
    if (x.manual) {
      parts.push('held ' + x.manual.breaker + ' by hand' + (x.manual.until ? ' until ' : ' until set to Auto'));
      if (x.manual.until) parts.push(timeNode(x.manual.until));
      if (x.manual.reason) parts.push(' (' + x.manual.reason + ')');
    } else if (x.until) {
      parts.push(x.state === 'open' ? 'next probe ' : x.state === 'ramping' ? 'ramp ends by ' : 'until ');
      parts.push(timeNode(x.until));
    } else if (x.state === 'halfOpen') {
      parts.push('a canary is being tried');
    }
    if (x.throttledUntil && parseTime(x.throttledUntil) > Date.now()) {
      if (parts.length) parts.push('; ');
      parts.push('asked to wait until ', timeNode(x.throttledUntil));
    }
    return parts.length ? parts : ['–'];
  }

  function upsertHost(x, etag) {
    const h = S.hosts;
    if (!h || !x || typeof x.host !== 'string') return;
    let entry = h.rows.get(x.host);
    if (!entry) {
      entry = hostRow(x.host);
      h.rows.set(x.host, entry);
      const body = $('hosts-body');
      let before = null;
      for (const tr of body.children) if (tr.dataset.host > x.host) { before = tr; break; }
      body.insertBefore(entry.row, before);
    }
    entry.data = x;
    entry.etag = etag || null;
    const c = entry.cells;
    setText(c.badge, (BREAKER_WORDS[x.state] || x.state) + (x.manual ? ' (by hand)' : ''));
    c.badge.className = 'badge ' + (BREAKER_CLASS[x.state] || '');
    c.state.dataset.state = x.state;
    setText(c.held, num(x.held));
    setText(c.failures, num(x.consecutiveFailures));
    setText(c.trips, num(x.trips));
    fill(c.until, ...hostUntil(x));
    const err = x.lastError ? String(x.lastError.type || '') + (x.lastError.detail ? ': ' + x.lastError.detail : '') : '–';
    setText(c.error, err.length > 90 ? err.slice(0, 89) + '…' : err);
    c.error.title = err;
    if (c.open) {
      const manual = x.manual ? x.manual.breaker : null;
      c.open.disabled = manual === 'open';
      c.closed.disabled = manual === 'closed';
      c.auto.disabled = !manual;
    }
  }

  async function hostAction(host, breaker) {
    const ask = {
      open: 'Hold host ' + host + ' open? No operation to it starts until it is closed or set to Auto; held operations keep their attempts.',
      closed: 'Close host ' + host + ' now? Its held operations start at once (no canary, no ramp); failures are counted but do not open it until Auto.',
    }[breaker];
    if (ask && !(await confirmAction(ask))) return;
    try {
      const r = await api('PATCH', '/v1/hosts/' + seg(host), {breaker});
      if (S.hosts) upsertHost(r.body, r.etag);
      notify('Host ' + host + ': ' + (breaker === 'auto' ? 'back to the automatic rules' : 'held ' + breaker + ' by hand') +
        ', now ' + (BREAKER_WORDS[r.body.state] || r.body.state) + '.', 'info');
    } catch (e) {
      failed('Setting host ' + host + ' ' + breaker, e);
    }
  }

  // ---- limiters (GET /v1/limiters, GET /v1/limiters/{name}/keys) ----
  const KEY_PAGE = 1000;      // keys read per limiter for its busiest ones
  const KEY_READS = 8;        // limiters whose keys are read per round
  const BUSIEST = 3;

  function openLimiters() {
    S.limiters = {rows: new Map(), keysRead: new Map()};
    clear($('limiters-body'));
    setText($('limiters-count'), '');
    loadLimiters(false);
    startPoll(() => loadLimiters(true), 2000);
  }

  async function loadLimiters(poll) {
    const L = S.limiters;
    if (!L || S.inFlight.has('limiters')) return;
    S.inFlight.add('limiters');
    try {
      const r = await api('GET', '/v1/limiters');
      if (S.limiters !== L) return;
      const list = (r.body && r.body.limiters) || [];
      const seen = new Set();
      for (const l of list) { seen.add(l.name); upsertLimiter(l); }
      for (const [name, entry] of L.rows) if (!seen.has(name)) { entry.row.remove(); L.rows.delete(name); }
      setText($('limiters-count'), '(' + list.length.toLocaleString('en') + ')');
      $('limiters-empty').hidden = list.length > 0;
      document.body.dataset.limitersRendered = 'true';
      // Busiest keys: re-read where the totals moved (at most every 5 s) or 30 s passed, a few
      // limiters a round: a page of keys can be 100 KB.
      const now = performance.now();
      let reads = 0;
      for (const l of list) {
        const entry = L.rows.get(l.name);
        const sig = l.running + '/' + l.waiting + '/' + l.keys;
        const last = L.keysRead.get(l.name);
        if (!l.keys) { fill(entry.cells.busiest, '–'); L.keysRead.set(l.name, {sig, at: now}); continue; }
        if (last && (last.sig === sig ? now - last.at < 30000 : now - last.at < 5000)) continue;
        if (reads++ >= KEY_READS) break;
        L.keysRead.set(l.name, {sig, at: now});
        await loadBusiest(L, l);
      }
    } catch (e) {
      if (!poll) failed('Reading the limiters', e);
    } finally {
      S.inFlight.delete('limiters');
    }
  }

  const keyName = (k) => (k === '' ? '""' : k);
  // A key's concurrency budget: its override's, else the limiter's.
  function keyBudget(l, key) {
    const o = l.overrides && Object.prototype.hasOwnProperty.call(l.overrides, key) ? l.overrides[key] : null;
    return {
      concurrency: o && o.concurrency !== undefined ? o.concurrency : l.concurrency,
      rate: o && o.rate !== undefined ? o.rate : l.rate,
    };
  }

  async function loadBusiest(L, l) {
    let r;
    try { r = await api('GET', '/v1/limiters/' + seg(l.name) + '/keys?limit=' + KEY_PAGE); } catch (e) { return; }
    const entry = L.rows.get(l.name);
    if (S.limiters !== L || !entry) return;
    const keys = ((r.body && r.body.keys) || []).slice();
    keys.sort((a, b) => (b.running - a.running) || (b.waiting - a.waiting) || (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    const ul = el('ul', {class: 'busiest'});
    for (const k of keys.slice(0, BUSIEST)) {
      if (!k.running && !k.waiting) break;
      const c = keyBudget(l, k.key).concurrency;
      ul.append(el('li', {'data-key': k.key, 'data-running': k.running, 'data-waiting': k.waiting},
        el('span', {class: 'mono', text: keyName(k.key)}),
        ': ' + num(k.running) + (typeof c === 'number' ? ' of ' + num(c) : '') + ' running, ' + num(k.waiting) + ' waiting'));
    }
    if (!ul.firstChild) ul.append(el('li', {class: 'muted', text: 'none running or waiting'}));
    const parts = [ul];
    if (r.body && r.body.next) parts.push(el('span', {class: 'muted', text: 'among the first ' + num(keys.length) + ' keys'}));
    fill(entry.cells.busiest, ...parts);
  }

  function upsertLimiter(l) {
    const L = S.limiters;
    let entry = L.rows.get(l.name);
    if (!entry) {
      const cells = {};
      const tr = el('tr', {'data-limiter': l.name});
      cells.name = el('th', {scope: 'row'});
      cells.concurrency = el('td', {class: 'num', 'data-field': 'concurrency'});
      cells.rate = el('td', {class: 'opt', 'data-field': 'rate'});
      cells.running = el('td', {class: 'num', 'data-field': 'running'});
      cells.waiting = el('td', {class: 'num', 'data-field': 'waiting'});
      cells.keys = el('td', {class: 'num opt', 'data-field': 'keys'});
      cells.busiest = el('td', {class: 'wrap', 'data-field': 'busiest', text: '…'});
      tr.append(cells.name, cells.concurrency, cells.rate, cells.running, cells.waiting, cells.keys, cells.busiest);
      entry = {row: tr, cells};
      L.rows.set(l.name, entry);
      const body = $('limiters-body');
      let before = null;
      for (const row of body.children) if (row.dataset.limiter > l.name) { before = row; break; }
      body.insertBefore(tr, before);
    }
    entry.data = l;
    const c = entry.cells;
    const overrides = l.overrides ? Object.keys(l.overrides).length : 0;
    fill(c.name, l.name, overrides ? el('span', {class: 'muted', text: ' (' + overrides + (overrides === 1 ? ' override)' : ' overrides)')}) : null);
    setText(c.concurrency, l.concurrency === null || l.concurrency === undefined ? '–' : num(l.concurrency));
    setText(c.rate, rateText(l.rate));
    setText(c.running, num(l.running));
    setText(c.waiting, num(l.waiting));
    setText(c.keys, num(l.keys));
  }

  // ---- schedules (GET /v1/schedules, /v1/queues/{q}/schedules[/{s}[/next]], pause, resume, trigger) ----
  const SCHED_PAGE = 200;
  const schedKey = (s) => s.queue + '/' + s.name;
  const schedPath = (queue, name) => '/v1/queues/' + seg(queue) + '/schedules/' + seg(name);

  // Rows of schedules, in the schedules view (every queue) or a queue's view (that queue's).
  // `queues`: those with a schedule shown, whose events (a run is an operation) re-read them.
  function schedTable(body, allQueues) {
    return {body, allQueues, rows: new Map(), queues: new Set(), next: null};
  }

  function openSchedules() {
    clear($('schedules-body'));
    setText($('schedules-count'), '');
    S.scheds = schedTable($('schedules-body'), true);
    loadSchedules(false, false);
    // Runs come with their queue's events; pauses and settings changed elsewhere show within 15 s.
    startPoll(() => loadSchedules(true, false), 15000);
  }

  async function loadSchedules(poll, more) {
    const T = S.scheds;
    if (!T || S.inFlight.has('schedules')) return;
    S.inFlight.add('schedules');
    try {
      const after = more ? T.next : null;
      const r = await api('GET', '/v1/schedules?limit=' + SCHED_PAGE + (after ? '&after=' + seg(after) : ''));
      if (S.scheds !== T) return;
      const list = (r.body && r.body.schedules) || [];
      for (const s of list) upsertSched(T, s);
      if (!more && !T.more) {
        const seen = new Set(list.map(schedKey));
        for (const [k, entry] of T.rows) if (!seen.has(k)) { entry.row.remove(); T.rows.delete(k); }
        T.next = r.body.next || null;
      } else if (more) {
        T.more = true;
        T.next = r.body.next || null;
      }
      $('schedules-more').hidden = !T.next;
      setText($('schedules-count'), '(' + T.rows.size.toLocaleString('en') + (T.next ? '+' : '') + ')');
      $('schedules-empty').hidden = T.rows.size > 0;
      document.body.dataset.schedulesRendered = 'true';
    } catch (e) {
      if (!poll) failed('Reading the schedules', e);
    } finally {
      S.inFlight.delete('schedules');
    }
  }

  // A queue's schedules, in its view (hidden when it has none).
  function openQueueSchedules(queue) {
    clear($('q-schedules-body'));
    $('q-sched').hidden = true;
    S.scheds = schedTable($('q-schedules-body'), false);
    refreshQueueSchedules(queue);
  }

  async function refreshQueueSchedules(queue) {
    const T = S.scheds;
    if (!T) return;
    let r;
    try {
      r = await api('GET', '/v1/queues/' + seg(queue) + '/schedules');
    } catch (e) {
      return;
    }
    if (S.scheds !== T) return;
    const list = (r.body && r.body.schedules) || [];
    const seen = new Set();
    for (const s of list) { seen.add(schedKey(s)); upsertSched(T, s); }
    for (const [k, entry] of T.rows) if (entry.data.queue === queue && !seen.has(k)) { entry.row.remove(); T.rows.delete(k); }
    if (!T.allQueues) $('q-sched').hidden = T.rows.size === 0;
  }

  function ruleText(s) {
    const rule = typeof s.every === 'number' ? 'every ' + num(s.every) + ' s' : 'cron ' + s.cron;
    return rule + (s.timezone && s.timezone !== 'UTC' ? ' (' + s.timezone + ')' : ' (UTC)');
  }

  function lastRunParts(s) {
    const r = s.lastRun;
    if (!r) return ['never'];
    return [timeNode(r.nominalTime), ' ', el('a', {href: '#/op/' + seg(r.operation), class: 'mono', text: r.operation}),
      r.state ? ' ' + r.state : ''];
  }

  function upsertSched(T, s) {
    if (!s || typeof s.name !== 'string' || typeof s.queue !== 'string') return;
    const k = schedKey(s);
    let entry = T.rows.get(k);
    if (!entry) {
      const cells = {};
      const tr = el('tr', {'data-schedule': k});
      const link = el('a', {href: '#/q/' + seg(s.queue) + '/s/' + seg(s.name), text: T.allQueues ? s.queue + ' / ' + s.name : s.name});
      tr.append(el('th', {scope: 'row'}, link));
      cells.rule = el('td', {class: 'opt', 'data-field': 'rule'});
      cells.next = el('td', {'data-field': 'nextRunAt'});
      cells.last = el('td', {'data-field': 'lastRun'});
      cells.counts = el('td', {class: 'num opt', 'data-field': 'counts'});
      cells.state = el('td', {'data-field': 'state'});
      cells.badge = el('span', {class: 'badge'});
      cells.state.append(cells.badge);
      tr.append(cells.rule, cells.next, cells.last, cells.counts, cells.state);
      const act = el('td', {class: 'act-col'});
      if (canWrite()) {
        cells.toggle = el('button', {type: 'button', class: 's-toggle'});
        cells.toggle.addEventListener('click', () => schedToggle(entry.data));
        cells.trigger = el('button', {type: 'button', class: 's-trigger', text: 'Run now…', 'aria-label': 'Run ' + s.queue + ' / ' + s.name + ' now'});
        cells.trigger.addEventListener('click', () => schedTrigger(entry.data));
        act.append(cells.toggle, ' ', cells.trigger);
      }
      tr.append(act);
      entry = {row: tr, cells, data: s};
      T.rows.set(k, entry);
      let before = null;
      for (const row of T.body.children) if (row.dataset.schedule > k) { before = row; break; }
      T.body.insertBefore(tr, before);
    }
    T.queues.add(s.queue);
    entry.data = s;
    const c = entry.cells;
    setText(c.rule, ruleText(s));
    fill(c.next, ...(s.isPaused ? ['paused'] : s.nextRunAt ? [timeNode(s.nextRunAt)] : ['none (past its end)']));
    fill(c.last, ...lastRunParts(s));
    setText(c.counts, num(s.runs) + ' · ' + num(s.skipped) + ' · ' + num(s.missed));
    setText(c.badge, s.isPaused ? 'paused' : 'active');
    c.badge.className = 'badge' + (s.isPaused ? ' paused' : '');
    c.badge.title = s.pausedNote || '';
    if (c.toggle) {
      setText(c.toggle, s.isPaused ? 'Resume' : 'Pause…');
      c.toggle.setAttribute('aria-label', (s.isPaused ? 'Resume ' : 'Pause ') + s.queue + ' / ' + s.name);
    }
  }

  // After an action: the answer shows in whatever shows that schedule.
  function showSched(s) {
    if (S.scheds && S.scheds.rows.has(schedKey(s))) upsertSched(S.scheds, s);
    if (S.sched && S.sched.queue === s.queue && S.sched.name === s.name) renderSchedule(s);
  }

  async function schedToggle(s) {
    const pausing = !s.isPaused;
    if (pausing && !(await confirmAction('Pause schedule ' + s.queue + ' / ' + s.name + '? Times that pass while it is paused are skipped, not caught up.'))) return;
    try {
      const r = await api('POST', schedPath(s.queue, s.name) + (pausing ? '/pause' : '/resume'), {});
      showSched(r.body);
    } catch (e) {
      failed((pausing ? 'Pausing ' : 'Resuming ') + s.queue + ' / ' + s.name, e);
    }
  }

  async function schedTrigger(s) {
    if (!(await confirmAction('Run schedule ' + s.queue + ' / ' + s.name + ' now? Its overlap policy (' + s.overlap + ') applies.'))) return;
    try {
      const r = await api('POST', schedPath(s.queue, s.name) + '/trigger', {});
      const b = r.body || {};
      if (b.admission === 'skipped') notify('Run of ' + s.name + ' skipped: its overlap policy (' + s.overlap + ') held it back.', 'info');
      else notify('Run of ' + s.name + ' ' + (b.admission === 'merged' ? 'merged into ' : 'created: ') + b.id + '.', 'info');
      const again = await api('GET', schedPath(s.queue, s.name));
      showSched(again.body);
    } catch (e) {
      failed('Running ' + s.queue + ' / ' + s.name, e);
    }
  }

  // One schedule: its settings, counts, last run, and a preview of its next runs.
  function openSchedule(queue, name) {
    S.sched = {queue, name, etag: null, data: null, nextFor: null};
    setText($('sched-name'), queue + ' / ' + name);
    setText($('sched-state'), '');
    clear($('sched-fields'));
    clear($('sched-next-body'));
    setText($('sched-op'), '');
    const back = $('sched-back');
    back.href = '#/q/' + seg(queue);
    setText(back, '← Queue ' + queue);
    refreshSchedule();
    startPoll(refreshSchedule, 5000);
  }

  async function refreshSchedule() {
    const cur = S.sched;
    if (!cur) return;
    try {
      const r = await api('GET', schedPath(cur.queue, cur.name), undefined, cur.etag ? {'If-None-Match': cur.etag} : undefined);
      if (S.sched !== cur || r.status === 304) return;
      cur.etag = r.etag;
      renderSchedule(r.body);
    } catch (e) {
      if (S.sched === cur && !cur.data) failed('Reading schedule ' + cur.name, e);
    }
  }

  function renderSchedule(s) {
    const cur = S.sched;
    if (!cur || !s) return;
    cur.data = s;
    const badge = $('sched-state');
    setText(badge, s.isPaused ? 'paused' : 'active');
    badge.className = 'badge' + (s.isPaused ? ' paused' : '');
    const fields = $('sched-fields');
    clear(fields);
    const add = (k, ...v) => { if (v.length && v[0] !== undefined && v[0] !== null && v[0] !== '') fields.append(el('dt', {text: k}), el('dd', null, ...v)); };
    add('When', ruleText(s));
    add('Next run', s.isPaused ? 'none while paused' : s.nextRunAt ? timeNode(s.nextRunAt) : 'none (past its end)');
    add('Last run', ...lastRunParts(s));
    add('Runs', num(s.runs) + ' created, ' + num(s.skipped) + ' skipped, ' + num(s.missed) + ' missed');
    add('Overlap', s.overlap);
    if (s.catchup) add('Catch-up', s.catchup.policy + ' within ' + num(s.catchup.window) + ' s, at most ' + num(s.catchup.maxRuns) + ' runs');
    if (s.jitter) add('Jitter', 'up to ' + s.jitter + ' s');
    if (s.startAt) add('Starts', timeNode(s.startAt));
    if (s.endAt) add('Ends', timeNode(s.endAt));
    add('Paused note', s.pausedNote);
    add('Created', timeNode(s.createdAt));
    setText($('sched-op'), JSON.stringify(s.operation, null, 2));
    if ($('sched-pause')) {
      $('sched-pause').hidden = s.isPaused;
      $('sched-resume').hidden = !s.isPaused;
    }
    // The preview again once its first run has passed (or on the first read).
    const key = String(s.nextRunAt) + '|' + s.revision;
    if (cur.nextFor !== key) { cur.nextFor = key; loadNextRuns(); }
  }

  async function loadNextRuns() {
    const cur = S.sched;
    if (!cur) return;
    const count = Number($('sched-next-count').value) || 10;
    try {
      const r = await api('GET', schedPath(cur.queue, cur.name) + '/next?count=' + count);
      if (S.sched !== cur) return;
      const body = $('sched-next-body');
      clear(body);
      const runs = (r.body && r.body.runs) || [];
      runs.forEach((run, i) => body.append(el('tr', {'data-nominal': run.nominalTime},
        el('td', {class: 'num', text: i + 1}),
        el('td', null, timeNode(run.nominalTime)),
        el('td', {class: 'mono', text: run.localTime || ''}),
        el('td', {text: run.note === 'gap' ? 'gap: the local time does not exist, runs right after' :
          run.note === 'repeated' ? 'repeated: the local time occurs twice' : (run.note || '')}))));
      if (!runs.length) body.append(el('tr', null, el('td', {colSpan: 4, class: 'muted', text: 'No run is due (paused, or past its end).'})));
    } catch (e) {
      if (S.sched === cur) failed('Previewing the next runs', e);
    }
  }

  // ---- why an operation waits, in words, with the numbers behind it ----
  // waitingParts gives the words at once; explainWaiting then reads what names the entry (the
  // limiter key, the host, the dependencies) and fills in its numbers.
  function waitingItem(w, o) {
    const li = el('li', {'data-type': w.type});
    fill(li, ...waitingParts(w, o, null));
    return li;
  }

  function waitingParts(w, o, extra) {
    const until = (prefix) => (w.until ? [prefix, timeNode(w.until)] : []);
    switch (w.type) {
      case 'dependencies': {
        const parts = ['waiting for ' + w.count + ' unfinished ' + (w.count === 1 ? 'dependency' : 'dependencies')];
        if (extra && extra.length) {
          parts.push(': ');
          extra.forEach((d, i) => {
            if (i) parts.push(', ');
            parts.push(el('a', {href: '#/op/' + seg(d.id), class: 'mono', text: d.id}), ' (' + d.state + ')');
          });
        }
        return parts;
      }
      case 'paused': return ['paused'];
      case 'notBefore': return ['not before ', timeNode(w.until)];
      case 'backoff': return ['waiting out its retry backoff', ...until(' until ')];
      case 'suspended': return ['its queue is suspended'];
      case 'concurrency': {
        const q = S.queues.get(o.queue);
        if (q) {
          const limit = q.data.effectiveMaxConcurrentOperationCount ?? q.data.maxConcurrentOperationCount;
          return ['its queue is full: ' + ((q.data.counts || {}).executing || 0) + ' of ' + limit + ' running'];
        }
        return ['its queue has no free slot'];
      }
      case 'rate': return ["its queue's rate limit", ...until(': next token ')];
      case 'limiter': {
        const head = 'waiting for limiter ' + w.limiter + ', key ' + keyName(w.key) + ': ';
        if (w.reason === 'rate') {
          const rate = extra && extra.budget ? ' (' + rateText(extra.budget.rate) + ')' : '';
          return [head + 'no token', ...until(' until '), rate];
        }
        if (extra && extra.key && typeof extra.budget.concurrency === 'number') {
          return [head + num(extra.key.running) + ' of ' + num(extra.budget.concurrency) + ' running' +
            (extra.key.waiting ? ', ' + num(extra.key.waiting) + ' waiting' : '')];
        }
        return [head + 'every slot is running'];
      }
      case 'host': {
        const link = el('a', {href: '#/hosts', class: 'mono', text: w.host});
        const tail = extra ? [' (' + num(extra.held) + ' held' + (extra.lastError ? '; last error: ' + extra.lastError.type : '') + ')'] : [];
        switch (w.state) {
          case 'open': return ['host ', link, ' is held: its breaker is open', ...until(' until '), ...tail];
          case 'halfOpen': return ['host ', link, ' is being probed: one canary runs first', ...tail];
          case 'ramping': return ['host ', link, ' is coming back: its starts ramp up', ...until(' until '), ...tail];
          case 'throttled': return ['host ', link, ' asked to wait', ...until(' until '), ...tail];
          default: return ['host ', link, ' is ' + w.state, ...until(' until '), ...tail];
        }
      }
      case 'debounce': return ['debounced: starts', ...until(' at '), ' unless another create moves it'];
      default: return [String(w.type)];
    }
  }

  // The largest string a limiter key can be that sorts before `key`: keys are sorted by Unicode
  // scalar and at most 128 scalars long, so that is key without its last scalar, that scalar less
  // one, then U+10FFFF up to 128 scalars. Paging from it with limit=1 reads that one key.
  function keyBefore(key) {
    const cps = Array.from(key);
    const last = cps.pop().codePointAt(0);
    if (last === 0) return cps.join('');
    let prev = last - 1;
    if (prev >= 0xD800 && prev <= 0xDFFF) prev = 0xD7FF;
    return cps.join('') + String.fromCodePoint(prev) + String.fromCodePoint(0x10FFFF).repeat(Math.max(0, 127 - cps.length));
  }

  async function waitingExtra(w, o) {
    switch (w.type) {
      case 'limiter': {
        const l = (await api('GET', '/v1/limiters/' + seg(w.limiter))).body;
        const budget = keyBudget(l, w.key);
        const q = w.key === '' ? '' : '&after=' + seg(keyBefore(w.key));
        const page = (await api('GET', '/v1/limiters/' + seg(w.limiter) + '/keys?limit=1' + q)).body;
        const k = page && page.keys && page.keys[0];
        return {budget, key: k && k.key === w.key ? k : null};
      }
      case 'host': return (await api('GET', '/v1/hosts/' + seg(w.host))).body;
      case 'dependencies': {
        const out = [];
        for (const id of (o.dependencies || []).slice(0, 10)) {
          try {
            const d = (await api('GET', '/v1/operations/' + seg(id))).body;
            if (d && d.state !== 'finished') out.push({id, state: d.state});
          } catch (_) { /* purged or gone: a finished one */ }
        }
        return out;
      }
      default: return null;
    }
  }

  function explainWaiting(o, list) {
    const op = S.op;
    (o.waitingOn || []).forEach((w, i) => {
      if (!['limiter', 'host', 'dependencies'].includes(w.type)) return;
      waitingExtra(w, o).then((extra) => {
        if (S.op !== op || !op.data || op.data.revision !== o.revision) return;
        const li = list.children[i];
        if (li && extra) fill(li, ...waitingParts(w, o, extra));
      }).catch(() => {});
    });
  }

  // ---- the event tail ----
  function renderTail() {
    if (!S.tail.length) return;
    const list = $('tail-list');
    const frag = document.createDocumentFragment();
    const fmt = (v) => (v === null || v === undefined ? '–' : typeof v === 'object' ? JSON.stringify(v) : String(v));
    for (let i = S.tail.length - 1; i >= 0; i--) {
      const ev = S.tail[i];
      // A host's breaker change names the host instead of a queue and an operation.
      const what = typeof ev.host === 'string' ?
        [el('a', {href: '#/hosts', text: 'host'}), ' ', el('span', {class: 'mono', text: ev.host})] :
        [el('a', {href: '#/q/' + seg(ev.queue), text: ev.queue}), ' ',
          el('a', {href: '#/op/' + seg(ev.operation), class: 'mono', text: ev.operation})];
      frag.append(el('li', {'data-seq': ev.seq},
        el('span', {class: 'seq', text: '#' + ev.seq}), ...what, ' ',
        ev.key + ' ' + fmt(ev.old) + ' → ' + fmt(ev.new)));
    }
    S.tail = [];
    list.insertBefore(frag, list.firstChild);
    while (list.children.length > TAIL_MAX) list.removeChild(list.lastChild);
  }

  // ---- wiring ----
  function wire() {
    $('notice-close').addEventListener('click', () => { $('notice').hidden = true; });
    $('login-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const t = $('login-token').value.trim();
      if (!t) { setText($('login-error'), 'Enter the token.'); return; }
      S.token = t;
      sessionStorage.setItem(TOKEN_KEY, t);
      $('login-token').value = '';
      setText($('login-error'), '');
      // A page that ran with another token may show what that one could do: start afresh.
      if (S.everStarted) location.reload();
      else start();
    });
    $('forget').addEventListener('click', () => {
      sessionStorage.removeItem(TOKEN_KEY);
      location.reload();
    });
    window.addEventListener('hashchange', route);
    document.addEventListener('visibilitychange', () => { if (!document.hidden) schedule(); });
    setInterval(refreshRates, 5000);  // local only: ages the per-minute counts, no requests
    setInterval(tickTimes, 1000);     // local only: "in 4 s" counts down
    $('hosts-more').addEventListener('click', () => loadHosts(false, true));
    $('schedules-more').addEventListener('click', () => loadSchedules(false, true));
    $('sched-next-form').addEventListener('submit', (e) => { e.preventDefault(); loadNextRuns(); });
    $('sched-next-count').addEventListener('change', loadNextRuns);
    if ($('sched-actions')) {
      $('sched-pause').addEventListener('click', () => { if (S.sched && S.sched.data) schedToggle(S.sched.data); });
      $('sched-resume').addEventListener('click', () => { if (S.sched && S.sched.data) schedToggle(S.sched.data); });
      $('sched-trigger').addEventListener('click', () => { if (S.sched && S.sched.data) schedTrigger(S.sched.data); });
    }

    $('q-search-form').addEventListener('submit', search);
    $('find-form').addEventListener('submit', find);
    $('q-filter-state').addEventListener('change', () => {
      if (S.view.queue) loadOps(S.view.queue, $('q-filter-state').value, $('q-search').value.trim(), true);
    });
    $('ops-more').addEventListener('click', () => { if (S.list) loadOps(S.list.queue, S.list.state, S.list.prefix, false); });
    $('op-events-more').addEventListener('click', loadOpEvents);
    $('confirm-no').addEventListener('click', () => $('confirm').close('no'));
    $('confirm-yes').addEventListener('click', () => $('confirm').close('yes'));

    if ($('q-actions')) {
      $('q-suspend').addEventListener('click', () => toggleSuspend(S.view.queue));
      $('q-resume').addEventListener('click', () => toggleSuspend(S.view.queue));
      $('q-conc-form').addEventListener('submit', async (e) => {
        e.preventDefault();
        const name = S.view.queue;
        const n = Number($('q-conc').value);
        if (!Number.isInteger(n) || n === 0 || n < -1) {
          notify('Max concurrent must be a positive whole number, or -1 for the server default.');
          return;
        }
        try {
          const r = await api('PATCH', '/v1/queues/' + seg(name), {maxConcurrentOperationCount: n});
          upsertQueue(r.body, r.etag);
          notify('Queue ' + name + ' now runs up to ' + n + ' at once.', 'info');
        } catch (err) {
          failed('Changing the concurrency of ' + name, err);
        }
      });
      $('q-bulk-form').addEventListener('submit', async (e) => {
        e.preventDefault();
        const name = S.view.queue;
        const state = $('q-bulk-state').value;
        const ok = await confirmAction('Cancel every ' + (state || 'unfinished') + ' operation of queue ' + name + '?');
        if (!ok) return;
        try {
          const r = await api('POST', '/v1/queues/' + seg(name) + '/operations:cancel', state ? {state} : {});
          notify('Cancelled ' + ((r.body && r.body.cancelled) ?? 0) + ' operation(s) of ' + name + '.', 'info');
        } catch (err) {
          failed('Bulk cancel in ' + name, err);
        }
      });
    }
    if ($('op-actions')) {
      for (const k of ['cancel', 'pause', 'resume', 'copy']) $('op-' + k).addEventListener('click', () => opAction(k));
    }
  }

  wire();
  start();
})();
