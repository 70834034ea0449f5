// Lakeshore dashboard: the little JavaScript the pages need (no inline scripts).
"use strict";

function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.content : "";
}

// htmx requests carry the page's CSRF token (a state-changing one is refused without it).
document.addEventListener("htmx:configRequest", (event) => {
  event.detail.headers["X-CSRF-Token"] = csrfToken();
});

// Live parts (data-live) poll only while the tab is visible.
document.addEventListener("htmx:beforeRequest", (event) => {
  if (document.hidden && event.detail.elt.hasAttribute("data-live")) event.preventDefault();
});

// A bulk action asks first.
document.addEventListener("submit", (event) => {
  const message = event.target.dataset && event.target.dataset.confirm;
  if (message && !window.confirm(message)) event.preventDefault();
});

// The admin's namespace switch.
document.addEventListener("change", (event) => {
  if (event.target.id !== "namespace-switch") return;
  const section = event.target.dataset.section || "queues";
  window.location = "/ui/ns/" + encodeURIComponent(event.target.value) + "/" + section;
});

// A queue's chart of pending, running and daemons, refreshed while the tab is visible.
function startChart(canvas) {
  if (typeof Chart === "undefined") return;
  const chart = new Chart(canvas, {
    type: "line",
    data: { labels: [], datasets: [
      { label: "pending", data: [], borderColor: "#9a6700", tension: 0.2, pointRadius: 2 },
      { label: "running", data: [], borderColor: "#1f6feb", tension: 0.2, pointRadius: 2 },
      { label: "daemons", data: [], borderColor: "#1a7f37", tension: 0, stepped: true, pointRadius: 2 },
    ] },
    options: { animation: false, maintainAspectRatio: false, responsive: true,
               scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } },
  });
  async function refresh() {
    if (document.hidden) return;
    const answer = await fetch(canvas.dataset.src, { credentials: "same-origin" });
    if (!answer.ok) return;
    const { points } = await answer.json();
    chart.data.labels = points.map((p) => new Date(p.at).toLocaleTimeString());
    chart.data.datasets[0].data = points.map((p) => p.pending);
    chart.data.datasets[1].data = points.map((p) => p.running);
    chart.data.datasets[2].data = points.map((p) => p.daemons);
    chart.update();
    canvas.dataset.points = String(points.length);
  }
  refresh();
  setInterval(refresh, 5000);
}

document.addEventListener("DOMContentLoaded", () => {
  const canvas = document.getElementById("series-chart");
  if (canvas) startChart(canvas);
});
