import { defineConfig } from "vitest/config";

// Tauri loads the built files from ui/dist (see tauri.conf.json at the repo root).
export default defineConfig({
  clearScreen: false,
  build: { target: "safari15", outDir: "dist", emptyOutDir: true },
  test: { environment: "jsdom", globals: true },
});
