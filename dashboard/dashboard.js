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
    for (const id of ['view-queues', 'view-queue', 'view-op', 'tail', 'find-form']) $(id).hidden = true;
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
    if (!canWrite()) for (const id of ['q-actions', 'op-actions', 'confirm']) $(id).remove();
    S.everStarted = true;
    $('tail').hidden = false;
    $('find-form').hidden = false;
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
    if (S.list && S.list.missed) {
      setText($('q-list-note'), S.list.missed.toLocaleString('en') + ' change(s) to operations not in this list since it was read; press Show to re-read it.');
    }
    if (wait) schedule(wait);
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

  // ---- views (the URL fragment: #/, #/q/NAME, #/op/ID) ----
  function route() {
    if (!S.started) return;
    const parts = location.hash.replace(/^#\/?/, '').split('/');
    let name = 'queues', arg = null;
    try {
      if (parts[0] === 'q' && parts[1]) { name = 'queue'; arg = decodeURIComponent(parts[1]); }
      else if (parts[0] === 'op' && parts[1]) { name = 'op'; arg = decodeURIComponent(parts[1]); }
    } catch (_) { name = 'queues'; }
    $('view-queues').hidden = name !== 'queues';
    $('view-queue').hidden = name !== 'queue';
    $('view-op').hidden = name !== 'op';
    if (name !== 'op') S.op = null;
    if (name !== 'queue') S.list = null;
    if (name === 'queue') {
      S.view = {name, queue: arg};
      openQueue(arg);
    } else if (name === 'op') {
      S.view = {name, id: arg};
      openOp(arg);
    } else {
      S.view = {name};
    }
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

  // One entry of waitingOn in words (API.md "Why is it not running?").
  function waitingText(w) {
    const until = w.until ? ' until ' + w.until : '';
    switch (w.type) {
      case 'dependencies': return w.count + ' unfinished ' + (w.count === 1 ? 'dependency' : 'dependencies');
      case 'paused': return 'paused';
      case 'notBefore': return 'not before ' + w.until;
      case 'debounce': return 'debounced: starts at ' + w.until + ' unless another create of its key moves that';
      case 'backoff': return 'retry backoff' + until;
      case 'suspended': return 'its queue is suspended';
      case 'concurrency': return 'its queue has no free slot';
      case 'rate': return "its queue's rate limit" + until;
      case 'limiter': return 'limiter ' + w.limiter + ', key ' + (w.key === '' ? '""' : w.key) + ': ' +
        (w.reason === 'rate' ? 'no token' + until : 'every slot is running');
      case 'host':
        switch (w.state) {
          case 'open': return 'host ' + w.host + ' is held: its breaker is open' + until;
          case 'halfOpen': return 'host ' + w.host + ' is being probed: one canary runs first';
          case 'ramping': return 'host ' + w.host + ' is coming back: its starts ramp up';
          case 'throttled': return 'host ' + w.host + ' asked to wait' + until;
          default: return 'host ' + w.host + ' is ' + w.state + until;
        }
      case 'debounce': return 'debounce' + until;
      default: return w.type;
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
    if (o.waitingOn) add('Waiting on', o.waitingOn.length ? o.waitingOn.map(waitingText).join('; ') : 'nothing: it runs or is next for a slot');
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

  // ---- the event tail ----
  function renderTail() {
    if (!S.tail.length) return;
    const list = $('tail-list');
    const frag = document.createDocumentFragment();
    const fmt = (v) => (v === null || v === undefined ? '–' : typeof v === 'object' ? JSON.stringify(v) : String(v));
    for (let i = S.tail.length - 1; i >= 0; i--) {
      const ev = S.tail[i];
      frag.append(el('li', {'data-seq': ev.seq},
        el('span', {class: 'seq', text: '#' + ev.seq}),
        el('a', {href: '#/q/' + seg(ev.queue), text: ev.queue}), ' ',
        el('a', {href: '#/op/' + seg(ev.operation), class: 'mono', text: ev.operation}), ' ',
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
