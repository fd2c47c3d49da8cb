// The microphone's path to the server: an AudioWorklet that downmixes to mono, resamples the AudioContext's
// rate (44.1 or 48 kHz, whatever the device runs at) to 16 kHz and posts s16le PCM frames to the page, which
// sends them over the WebSocket. Loaded as a plain script too (no AudioWorkletProcessor there): then it only
// defines the Resampler, so that it can be tested in a page.
"use strict";

// A streaming band-limited resampler: each output sample is the input convolved with a Blackman-windowed sinc
// low-pass whose cutoff sits below the lower of the two Nyquist rates, so speech above 8 kHz does not alias into
// the 16 kHz signal. Input is pushed in pieces of any size; samples before the first are taken as zeros.
class Resampler {
  constructor(inRate, outRate, zeroCrossings = 16) {
    this.step = inRate / outRate;  // input samples per output sample
    this.passthrough = inRate === outRate;
    this.fc = 0.5 * Math.min(1, outRate / inRate) * 0.92;  // cutoff, cycles per input sample: 92% of Nyquist
    this.half = Math.ceil(zeroCrossings / (2 * this.fc));  // the filter's half width in input samples
    this.buf = new Float32Array(0);
    this.bufStart = 0;  // input index of buf[0]
    this.total = 0;  // input samples pushed
    this.n = 0;  // index of the next output sample (at input position n * step)
  }

  push(x) {
    if (this.passthrough) return Float32Array.from(x);
    const joined = new Float32Array(this.buf.length + x.length);
    joined.set(this.buf);
    joined.set(x, this.buf.length);
    this.buf = joined;
    this.total += x.length;
    return this.run(this.total - 1);
  }

  // The outputs still owed at the end of the input (its tail convolved with zeros beyond it).
  flush() {
    if (this.passthrough) return new Float32Array(0);
    return this.run(Infinity);
  }

  run(lastInput) {
    const out = [];
    for (;;) {
      const t = this.n * this.step;
      if (t >= this.total || t + this.half > lastInput) break;
      out.push(this.at(t));
      this.n += 1;
    }
    const drop = Math.floor(this.n * this.step) - this.half - this.bufStart;  // no later output reads these
    if (drop > 0) {
      this.buf = this.buf.slice(drop);
      this.bufStart += drop;
    }
    return Float32Array.from(out);
  }

  at(t) {
    const lo = Math.max(Math.ceil(t - this.half), this.bufStart);
    const hi = Math.min(Math.floor(t + this.half), this.bufStart + this.buf.length - 1);
    let y = 0;
    for (let k = lo; k <= hi; k++) {
      const d = t - k;
      const a = 2 * Math.PI * this.fc * d;
      const sinc = d === 0 ? 2 * this.fc : Math.sin(a) / (Math.PI * d);
      const c = Math.cos(Math.PI * d / this.half);
      const w = 0.42 + 0.5 * c + 0.08 * (2 * c * c - 1);  // Blackman: cos(2x) = 2 cos(x)^2 - 1
      y += this.buf[k - this.bufStart] * sinc * w;
    }
    return y;
  }
}

// Float samples in [-1, 1] as 16-bit integers (little-endian on every platform browsers run on).
function toInt16(x) {
  const out = new Int16Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const s = Math.max(-1, Math.min(1, x[i]));
    out[i] = s < 0 ? s * 0x8000 : s * 0x7fff;
  }
  return out;
}

globalThis.AsrkitResampler = Resampler;
globalThis.asrkitToInt16 = toInt16;

if (typeof AudioWorkletProcessor !== "undefined") {
  // Posts an ArrayBuffer of s16le samples every frameMs; on the message "flush" posts what is left and then
  // {flushed: true}, and stops.
  class PcmSender extends AudioWorkletProcessor {
    constructor(options) {
      super();
      const opts = options.processorOptions || {};
      const rate = opts.targetRate || 16000;
      this.resampler = new Resampler(sampleRate, rate);  // sampleRate: the AudioContext's, a worklet global
      this.frame = new Float32Array(Math.round(rate * (opts.frameMs || 100) / 1000));
      this.fill = 0;
      this.running = true;
      this.port.onmessage = (e) => {
        if (e.data !== "flush" || !this.running) return;
        this.running = false;
        this.emit(this.resampler.flush());
        this.post(this.frame.subarray(0, this.fill));
        this.port.postMessage({flushed: true});
      };
    }

    process(inputs) {
      if (!this.running) return false;
      const channels = inputs[0];
      if (channels.length > 0) {
        const mono = new Float32Array(channels[0].length);
        for (const ch of channels) for (let i = 0; i < mono.length; i++) mono[i] += ch[i] / channels.length;
        this.emit(this.resampler.push(mono));
      }
      return true;
    }

    emit(samples) {
      for (let i = 0; i < samples.length; i++) {
        this.frame[this.fill++] = samples[i];
        if (this.fill === this.frame.length) {
          this.post(this.frame);
          this.fill = 0;
        }
      }
    }

    post(samples) {
      if (samples.length === 0) return;
      const pcm = toInt16(samples);
      this.port.postMessage(pcm.buffer, [pcm.buffer]);
    }
  }
  registerProcessor("asrkit-pcm-sender", PcmSender);
}
