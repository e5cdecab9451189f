// With LANG unset (or "C"), WebKitGTK reports navigator.language = "C", which Intl rejects; uPlot
// builds an Intl.NumberFormat at load time and would throw. Fall back to en-US. Must load first.
try {
  new Intl.NumberFormat(navigator.language);
} catch {
  Object.defineProperty(Navigator.prototype, "language", { get: () => "en-US", configurable: true });
  Object.defineProperty(Navigator.prototype, "languages", { get: () => ["en-US"], configurable: true });
}
export {};
