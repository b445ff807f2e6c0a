// Stockade approval console: follows the workspace's changes (Server-Sent
// Events) and puts the server's new rendering of what changed in place;
// sends the decision forms without leaving the page; counts down expiries.
// The server renders (and escapes) everything; this script only moves its
// fragments. Without it, every page still works by links and forms.
'use strict';
(function () {
  const meta = document.querySelector('meta[name="csrf-token"]');
  const csrf = meta ? meta.content : '';
  const fragmentHeaders = { 'X-Stockade-Fragment': '1' };

  function signIn() { location.assign('/ui/sign-in?ended=1'); }

  // parse turns the server's HTML into nodes; scripts in it never run.
  function parse(html) {
    const t = document.createElement('template');
    t.innerHTML = html;
    return t.content;
  }

  async function fetchFragment(url) {
    const r = await fetch(url, { headers: fragmentHeaders, credentials: 'same-origin' });
    if (r.status === 401) { signIn(); return null; }
    if (!r.ok) return null;
    return r.text();
  }

  function updateCount() {
    const list = document.getElementById('pending');
    if (!list) return;
    const n = list.querySelectorAll('.card[data-status="pending"]').length;
    const count = document.getElementById('pending-count');
    if (count) count.textContent = String(n);
    const empty = document.getElementById('pending-empty');
    if (empty) empty.hidden = list.children.length > 0;
  }

  async function refreshCard(id, isNew) {
    const old = document.getElementById('card-' + id);
    if (!old && !isNew) return;
    const html = await fetchFragment('/ui/fragments/card/' + encodeURIComponent(id));
    if (html === null) return;
    const now = document.getElementById('card-' + id);
    // A card being edited keeps what the approver typed.
    const reason = now && now.querySelector('textarea');
    const typed = reason ? reason.value : '';
    const node = parse(html);
    if (now) {
      now.replaceWith(node);
    } else {
      const list = document.getElementById('pending');
      if (list) list.append(node);
    }
    const fresh = document.getElementById('card-' + id);
    const area = fresh && fresh.querySelector('textarea');
    if (area && typed) area.value = typed;
    updateCount();
  }

  async function refreshLists() {
    const lists = document.getElementById('approval-lists');
    if (lists) {
      const html = await fetchFragment('/ui/fragments/pending');
      if (html !== null) lists.replaceChildren(parse(html));
    }
    const rows = document.getElementById('execution-rows');
    if (rows && rows.dataset.query !== undefined) {
      const html = await fetchFragment('/ui/fragments/executions?' + rows.dataset.query);
      if (html !== null) rows.replaceChildren(parse(html));
    }
  }

  function onChange(c) {
    if (document.getElementById('approval-lists')) {
      if (c.approval_id) refreshCard(c.approval_id, c.kind === 'approval_requested');
    }
    if (document.getElementById('execution-rows')) refreshLists();
  }

  const live = document.body.dataset.live;
  if (live && window.EventSource) {
    const es = new EventSource('/ui/events');
    let opened = false;
    es.addEventListener('ready', function () {
      // After a reconnect, changes may have been missed.
      if (opened) refreshLists();
      opened = true;
    });
    es.addEventListener('change', function (e) { onChange(JSON.parse(e.data)); });
    es.addEventListener('resync', refreshLists);
    es.addEventListener('signed_out', function () { es.close(); signIn(); });
    // A stream refused (the session ended while the page was away) does
    // not reconnect: a fetch finds out whether to sign in again.
    es.addEventListener('error', function () {
      if (es.readyState === EventSource.CLOSED) fetchFragment('/ui/fragments/pending');
    });
  }

  // Decision forms: sent in the background, the card replaced by the
  // answer (the decided card, or the card with why it was refused).
  document.addEventListener('submit', async function (ev) {
    const form = ev.target;
    if (!form.dataset.fragment || !window.fetch) return;
    ev.preventDefault();
    const button = ev.submitter;
    const action = (button && button.formAction) || form.action;
    const body = new URLSearchParams(new FormData(form));
    form.querySelectorAll('button').forEach(function (b) { b.disabled = true; });
    try {
      const r = await fetch(action, {
        method: 'POST', body: body, credentials: 'same-origin',
        headers: Object.assign({ 'X-CSRF-Token': csrf }, fragmentHeaders),
      });
      if (r.status === 401) { signIn(); return; }
      const html = await r.text();
      const target = document.getElementById(form.dataset.fragment);
      if (target && (r.headers.get('Content-Type') || '').startsWith('text/html')) target.replaceWith(parse(html));
      updateCount();
    } catch (e) {
      form.querySelectorAll('button').forEach(function (b) { b.disabled = false; });
    }
  });

  // Expiry countdowns.
  function tick() {
    const now = Date.now();
    document.querySelectorAll('[data-expires]').forEach(function (el) {
      const left = Math.round((Date.parse(el.dataset.expires) - now) / 1000);
      if (left <= 0) { el.textContent = '(expiring)'; return; }
      const m = Math.floor(left / 60), s = left % 60;
      el.textContent = '(in ' + (m > 0 ? m + ' min ' : '') + s + ' s)';
    });
  }
  tick();
  setInterval(tick, 1000);
})();
