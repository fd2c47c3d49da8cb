// The page of `asrkit serve`: records the microphone (AudioWorklet -> 16 kHz s16le over WS /v1/stream) or sends a
// chosen file (POST /v1/transcribe), shows the partial text as it comes and the final transcript as word buttons
// that play the kept audio from their start. ?token=T in the page's address is passed on to the server.
"use strict";

(() => {
  const RATE = 16000;
  const FRAME_MS = 100;  // how much audio each WebSocket frame carries
  const $ = (id) => document.getElementById(id);
  const ui = {
    record: $("record"), file: $("file"), upload: $("upload"), status: $("status"), error: $("error"),
    player: $("player"), transcript: $("transcript"), partial: $("partial"), model: $("model"), rtf: $("rtf"),
  };
  const token = new URLSearchParams(location.search).get("token");
  const auth = token ? {Authorization: `Bearer ${token}`} : {};
  let live = null;  // the recording in progress: {media, ctx, node, ws, pcm: [ArrayBuffer], done, stopping, rtfTimer}
  let busy = false;  // a recording or an upload is under way
  let words = [];  // [{start, end, el}] of the transcript shown
  let audioUrl = null;

  const setStatus = (text) => { ui.status.textContent = text; };
  function showError(text) {
    ui.error.textContent = text;
    ui.error.hidden = !text;
  }
  const seconds = (t) => `${Number(t).toFixed(2)} s`;

  // Buttons are marked aria-disabled, not disabled, while they cannot act: a disabled button loses the keyboard
  // focus (Space on Record, then Space again to stop, must find it where it was).
  const enabled = (button) => button.getAttribute("aria-disabled") !== "true";
  function updateButtons() {
    ui.record.setAttribute("aria-disabled", String(busy && !(live && !live.stopping)));
    ui.upload.setAttribute("aria-disabled", String(busy || ui.file.files.length === 0));
  }

  // -- server facts ----------------------------------------------------------------------------------------------
  async function loadInfo() {
    try {
      const r = await fetch("v1/info", {headers: auth});
      if (!r.ok) throw new Error(await errorText(r));
      const info = await r.json();
      ui.model.textContent = info.model;
    } catch (e) {
      ui.model.textContent = "unavailable";
      showError(`Cannot reach the server: ${e.message}`);
    }
  }

  function showRtf(value, how) {
    if (!Number.isFinite(value)) return;
    ui.rtf.textContent = value.toFixed(3);
    ui.rtf.title = how;
  }

  // The server's compute seconds per audio second over all its streams (GET /v1/info's rtf).
  async function loadServerRtf() {
    try {
      const r = await fetch("v1/info", {headers: auth});
      if (r.ok) showRtf((await r.json()).rtf, "the server's compute seconds per audio second (all streams)");
    } catch (e) { /* the RTF is a nicety: the transcript does not need it */ }
  }

  async function errorText(response) {
    const body = await response.text();
    try { return JSON.parse(body).message || body; } catch (e) { return body || response.statusText; }
  }

  // -- transcript ------------------------------------------------------------------------------------------------
  function clearTranscript() {
    ui.transcript.replaceChildren();
    ui.partial.textContent = "";
    words = [];
  }

  // One final segment {start, end, text, words: [{word, start, end, confidence}]} as a paragraph of word buttons.
  function addSegment(seg) {
    const p = document.createElement("p");
    p.className = "segment";
    const time = document.createElement("span");
    time.className = "time";
    time.textContent = `${Number(seg.start).toFixed(1)}–${Number(seg.end).toFixed(1)} s`;
    p.append(time, " ");
    const segWords = seg.words || [];
    if (segWords.length === 0 && seg.text) p.append(seg.text);  // a segment without word times
    segWords.forEach((w, i) => {
      const b = document.createElement("button");
      b.type = "button";
      b.className = w.confidence < 0.5 ? "word low" : "word";
      b.textContent = w.word;
      b.title = `${seconds(w.start)} to ${seconds(w.end)}, confidence ${Number(w.confidence).toFixed(2)}`;
      b.dataset.start = w.start;
      b.addEventListener("click", () => playFrom(w.start));
      if (i > 0) p.append(" ");
      p.append(b);
      words.push({start: w.start, end: w.end, el: b});
    });
    ui.transcript.append(p);
  }

  // A whole result (result_to_dict): its segments, each with the words that fall in it.
  function showResult(result) {
    clearTranscript();
    const all = result.words || [];
    const segs = result.segments && result.segments.length ? result.segments
      : [{start: 0, end: result.duration || 0, text: result.text || ""}];
    let i = 0;
    segs.forEach((s, k) => {
      const first = i;
      while (i < all.length && (k === segs.length - 1 || all[i].start < s.end)) i++;
      addSegment({...s, words: all.slice(first, i)});
    });
  }

  // -- playback --------------------------------------------------------------------------------------------------
  function setAudio(blob) {
    if (audioUrl) URL.revokeObjectURL(audioUrl);
    audioUrl = URL.createObjectURL(blob);
    ui.player.src = audioUrl;
    ui.player.hidden = false;
  }

  function playFrom(t) {
    if (!audioUrl) return;
    ui.player.currentTime = t;
    ui.player.play().catch((e) => showError(`Cannot play the audio: ${e.message}`));
  }

  ui.player.addEventListener("timeupdate", () => {
    const t = ui.player.currentTime;
    for (const w of words) w.el.classList.toggle("playing", !ui.player.paused && t >= w.start && t < w.end);
  });

  // 16 kHz mono s16le pieces as a WAV file, so the recording plays in the <audio> element.
  function wavBlob(pieces) {
    const bytes = pieces.reduce((n, b) => n + b.byteLength, 0);
    const head = new DataView(new ArrayBuffer(44));
    const text = (at, s) => [...s].forEach((c, i) => head.setUint8(at + i, c.charCodeAt(0)));
    text(0, "RIFF"); head.setUint32(4, 36 + bytes, true); text(8, "WAVE");
    text(12, "fmt "); head.setUint32(16, 16, true); head.setUint16(20, 1, true); head.setUint16(22, 1, true);
    head.setUint32(24, RATE, true); head.setUint32(28, RATE * 2, true); head.setUint16(32, 2, true);
    head.setUint16(34, 16, true); text(36, "data"); head.setUint32(40, bytes, true);
    return new Blob([head.buffer, ...pieces], {type: "audio/wav"});
  }

  // -- the microphone --------------------------------------------------------------------------------------------
  // Opens WS /v1/stream and resolves once the server answered the start message with "ready".
  function openStream() {
    const url = new URL("v1/stream", location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    if (token) url.searchParams.set("token", token);
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    return new Promise((resolve, reject) => {
      ws.onopen = () => ws.send(JSON.stringify({type: "start", sample_rate: RATE, format: "s16le", name: "browser"}));
      ws.onmessage = (e) => {
        const msg = JSON.parse(e.data);
        if (msg.type === "ready") resolve(ws);
        else if (msg.type === "error") reject(new Error(msg.message));
      };
      ws.onclose = (e) => reject(new Error(`the server closed the stream (${e.code}${e.reason ? `: ${e.reason}` : ""})`));
    });
  }

  function onMessage(e) {
    const msg = JSON.parse(e.data);
    if (msg.type === "partial") {
      ui.partial.textContent = msg.text;
    } else if (msg.type === "final") {
      ui.partial.textContent = "";
      addSegment(msg);
    } else if (msg.type === "done") {
      live.done = true;
      showResult(msg.result);
      loadServerRtf();
      setStatus(`Done: ${seconds(msg.result.duration)} of audio. Select a word to play from there.`);
    } else if (msg.type === "error") {
      showError(msg.message);
    }
  }

  function onClose(e) {
    const rec = live;
    if (!rec) return;
    if (!rec.done && ui.error.hidden) showError(`The stream ended early (${e.code}${e.reason ? `: ${e.reason}` : ""}).`);
    release(rec);
    live = null;
    busy = false;
    ui.record.textContent = "Record";
    ui.record.classList.remove("recording");
    updateButtons();
    if (rec.pcm.length) setAudio(wavBlob(rec.pcm));
  }

  function release(rec) {
    clearInterval(rec.rtfTimer);
    rec.media.getTracks().forEach((t) => t.stop());
    rec.ctx.close();
  }

  async function startRecording() {
    if (!navigator.mediaDevices || !window.AudioWorkletNode) {
      showError("The microphone needs a secure page: open it at https:// or on localhost (files work anywhere).");
      return;
    }
    showError("");
    clearTranscript();
    busy = true;
    updateButtons();
    setStatus("Starting the microphone…");
    let media = null, ctx = null;
    try {
      media = await navigator.mediaDevices.getUserMedia(
        {audio: {channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false}});
      ctx = new AudioContext();
      await ctx.audioWorklet.addModule("static/worklet.js");
      const ws = await openStream();
      const node = new AudioWorkletNode(ctx, "asrkit-pcm-sender", {processorOptions: {targetRate: RATE, frameMs: FRAME_MS}});
      live = {media, ctx, node, ws, pcm: [], done: false, stopping: false, rtfTimer: setInterval(loadServerRtf, 2000)};
      ws.onmessage = onMessage;
      ws.onclose = onClose;
      node.port.onmessage = (e) => {
        if (e.data instanceof ArrayBuffer) {
          live.pcm.push(e.data);
          if (ws.readyState === WebSocket.OPEN) ws.send(e.data);
        } else if (e.data.flushed && ws.readyState === WebSocket.OPEN) {
          ws.send(JSON.stringify({type: "end"}));
        }
      };
      ctx.createMediaStreamSource(media).connect(node);
      node.connect(ctx.destination);  // silent output: keeps the node pulled by the audio graph
      ui.record.textContent = "Stop";  // its name says what it does now (no aria-pressed: the name changes)
      ui.record.classList.add("recording");
      updateButtons();
      setStatus(`Recording at ${ctx.sampleRate} Hz, sent at 16 kHz. Press Stop to finish.`);
    } catch (e) {
      if (media) media.getTracks().forEach((t) => t.stop());
      if (ctx) ctx.close();
      live = null;
      showError(`Cannot record: ${e.message}`);
      setStatus("");
      busy = false;
      updateButtons();
    }
  }

  function stopRecording() {
    live.stopping = true;
    updateButtons();
    setStatus("Finishing the transcript…");
    live.media.getTracks().forEach((t) => t.stop());
    live.node.port.postMessage("flush");  // the worklet posts its last samples, then {flushed}: then "end"
  }

  ui.record.addEventListener("click", () => {
    if (!enabled(ui.record)) return;
    if (live) stopRecording();
    else startRecording();
  });

  // -- a file ----------------------------------------------------------------------------------------------------
  ui.file.addEventListener("change", updateButtons);

  async function transcribeFile() {
    const file = ui.file.files[0];
    if (!file || !enabled(ui.upload)) return;
    showError("");
    clearTranscript();
    busy = true;
    updateButtons();
    setStatus(`Transcribing ${file.name}…`);
    setAudio(file);
    const began = performance.now();
    try {
      const r = await fetch("v1/transcribe?format=json",
        {method: "POST", headers: {...auth, "Content-Type": "application/octet-stream"}, body: file});
      if (!r.ok) throw new Error(await errorText(r));
      const result = await r.json();
      if (result.error) throw new Error(result.error);
      showResult(result);
      const wall = (performance.now() - began) / 1000;
      if (result.duration > 0) showRtf(wall / result.duration, "seconds from upload to transcript per audio second");
      setStatus(`Done: ${file.name}, ${seconds(result.duration)} of audio. Select a word to play from there.`);
    } catch (e) {
      showError(`Cannot transcribe ${file.name}: ${e.message}`);
      setStatus("");
    } finally {
      busy = false;
      updateButtons();
    }
  }

  ui.upload.addEventListener("click", transcribeFile);
  loadInfo();
})();
