"""``nvidia-smi -q -x``: the same per-GPU facts as ``-q`` (:func:`gpuctl.lab.sim.nvsmi.gpu_values`)
as XML, in the element names, nesting and tab indentation of a real 590-driver (DTD v13) capture:
tests/fixtures/nvidia-smi/nvsmi-q-x-rtx-a5000-2gpu-590.txt. Where that capture's card lacks a
section the H100 text has (the T.Limit temperatures, ``gpu_reset_status``), the element names
are those of the v12 A100 capture / the DTD. Standard library only (runs inside lab nodes).

A profile whose driver is of the R570 branch or older (the lab's 570.172.08) gets the layout
of that branch (DTD v12, as the real 570.124.04 capture
tests/fixtures/nvidia-smi/nvsmi-q-x-rtx3060-1gpu-570.txt prints it): without the elements that
first appear in the 590 capture, and with ``<voltage>`` before ``<fabric>``.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from . import load
from .common import Faults, Profile
from .nvsmi import gpu_values, selected_gpus

DOCTYPE = '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">'
DOCTYPE_V12 = '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">'
# The newest branch whose -q -x layout is the v12 one (570.124.04 prints v12, 590.44.01 v13).
LAST_V12_BRANCH = 570
# One-line elements of the 590 (v13) capture that the 570 (v12) capture does not print.
_V13_ELEMENTS = (
    "display_attached",
    "pdi",
    "channel_repair_pending",
    "tpc_repair_pending",
    "unrepairable_memory",
    "edpp_multiplier",
    "summary",
    "incorrect_configuration",
)
_V13_BLOCKS = ("clocks_event_reasons_counters",)  # whole sections, v13 only
_V12_VOLTAGE = "    <voltage>\n        <graphics_volt>N/A</graphics_volt>\n    </voltage>\n"

# Written with four blanks a level; turned into the tabs nvidia-smi prints below.
# fmt: off
_GPU_TEMPLATE = """\
<gpu id={gpu_id}>
    <product_name>{name}</product_name>
    <product_brand>NVIDIA</product_brand>
    <product_architecture>{arch}</product_architecture>
    <display_mode>Requested functionality has been deprecated</display_mode>
    <display_attached>No</display_attached>
    <display_active>Disabled</display_active>
    <persistence_mode>Enabled</persistence_mode>
    <addressing_mode>None</addressing_mode>
    <mig_mode>
        <current_mig>Disabled</current_mig>
        <pending_mig>Disabled</pending_mig>
    </mig_mode>
    <mig_devices>
        None
    </mig_devices>
    <accounting_mode>Disabled</accounting_mode>
    <accounting_mode_buffer_size>4000</accounting_mode_buffer_size>
    <driver_model>
        <current_dm>N/A</current_dm>
        <pending_dm>N/A</pending_dm>
    </driver_model>
    <serial>{serial}</serial>
    <uuid>{uuid}</uuid>
    <pdi>N/A</pdi>
    <minor_number>{minor}</minor_number>
    <vbios_version>{vbios}</vbios_version>
    <multigpu_board>No</multigpu_board>
    <board_id>{board_id}</board_id>
    <board_part_number>{board_part}</board_part_number>
    <gpu_part_number>2330-885-A1</gpu_part_number>
    <gpu_fru_part_number>N/A</gpu_fru_part_number>
    <platformInfo>
        <chassis_serial_number>N/A</chassis_serial_number>
        <slot_number>N/A</slot_number>
        <tray_index>N/A</tray_index>
        <host_id>N/A</host_id>
        <peer_type>N/A</peer_type>
        <module_id>{module_id}</module_id>
        <gpu_fabric_guid>N/A</gpu_fabric_guid>
    </platformInfo>
    <inforom_version>
        <img_version>{inforom}</img_version>
        <oem_object>2.1</oem_object>
        <ecc_object>7.16</ecc_object>
        <pwr_object>N/A</pwr_object>
    </inforom_version>
    <inforom_bbx_flush>
        <latest_timestamp>2024/11/14 06:25:18.433</latest_timestamp>
        <latest_duration>92243 us</latest_duration>
    </inforom_bbx_flush>
    <gpu_operation_mode>
        <current_gom>N/A</current_gom>
        <pending_gom>N/A</pending_gom>
    </gpu_operation_mode>
    <c2c_mode>Disabled</c2c_mode>
    <gpu_virtualization_mode>
        <virtualization_mode>None</virtualization_mode>
        <host_vgpu_mode>N/A</host_vgpu_mode>
        <vgpu_heterogeneous_mode>N/A</vgpu_heterogeneous_mode>
    </gpu_virtualization_mode>
    <gpu_reset_status>
        <reset_required>No</reset_required>
        <drain_and_reset_recommended>No</drain_and_reset_recommended>
    </gpu_reset_status>
    <gpu_recovery_action>None</gpu_recovery_action>
    <gsp_firmware_version>{gsp_fw}</gsp_firmware_version>
    <ibmnpu>
        <relaxed_ordering_mode>N/A</relaxed_ordering_mode>
    </ibmnpu>
    <pci>
        <pci_bus>{xml_pci_bus}</pci_bus>
        <pci_device>00</pci_device>
        <pci_domain>0000</pci_domain>
        <pci_base_class>3</pci_base_class>
        <pci_sub_class>2</pci_sub_class>
        <pci_device_id>{xml_device_id}</pci_device_id>
        <pci_bus_id>{bus_id}</pci_bus_id>
        <pci_sub_system_id>{xml_subsys_id}</pci_sub_system_id>
        <pci_gpu_link_info>
            <pcie_gen>
                <max_link_gen>{gen_max}</max_link_gen>
                <current_link_gen>{gen_cur}</current_link_gen>
                <device_current_link_gen>{gen_cur}</device_current_link_gen>
                <max_device_link_gen>{gen_max}</max_device_link_gen>
                <max_host_link_gen>{gen_max}</max_host_link_gen>
            </pcie_gen>
            <link_widths>
                <max_link_width>{width_max}x</max_link_width>
                <current_link_width>{width_cur}x</current_link_width>
            </link_widths>
        </pci_gpu_link_info>
        <pci_bridge_chip>
            <bridge_chip_type>N/A</bridge_chip_type>
            <bridge_chip_fw>N/A</bridge_chip_fw>
        </pci_bridge_chip>
        <replay_counter>0</replay_counter>
        <replay_rollover_counter>0</replay_rollover_counter>
        <tx_util>567 KB/s</tx_util>
        <rx_util>559 KB/s</rx_util>
        <atomic_caps_outbound>{atomic}</atomic_caps_outbound>
        <atomic_caps_inbound>{atomic}</atomic_caps_inbound>
    </pci>
    <fan_speed>N/A</fan_speed>
    <performance_state>{pstate}</performance_state>
    <clocks_event_reasons>
        <clocks_event_reason_gpu_idle>{cer_idle}</clocks_event_reason_gpu_idle>
        <clocks_event_reason_applications_clocks_setting>Not Active</clocks_event_reason_applications_clocks_setting>
        <clocks_event_reason_sw_power_cap>Not Active</clocks_event_reason_sw_power_cap>
        <clocks_event_reason_hw_slowdown>{cer_hw}</clocks_event_reason_hw_slowdown>
        <clocks_event_reason_hw_thermal_slowdown>{cer_hw_thermal}</clocks_event_reason_hw_thermal_slowdown>
        <clocks_event_reason_hw_power_brake_slowdown>Not Active</clocks_event_reason_hw_power_brake_slowdown>
        <clocks_event_reason_sync_boost>Not Active</clocks_event_reason_sync_boost>
        <clocks_event_reason_sw_thermal_slowdown>Not Active</clocks_event_reason_sw_thermal_slowdown>
        <clocks_event_reason_display_clocks_setting>Not Active</clocks_event_reason_display_clocks_setting>
    </clocks_event_reasons>
    <clocks_event_reasons_counters>
        <clocks_event_reasons_counters_sw_power_cap>0 us</clocks_event_reasons_counters_sw_power_cap>
        <clocks_event_reasons_counters_sync_boost>0 us</clocks_event_reasons_counters_sync_boost>
        <clocks_event_reasons_counters_sw_therm_slowdown>0 us</clocks_event_reasons_counters_sw_therm_slowdown>
        <clocks_event_reasons_counters_hw_therm_slowdown>{xml_hw_therm_us} us</clocks_event_reasons_counters_hw_therm_slowdown>
        <clocks_event_reasons_counters_hw_power_brake>0 us</clocks_event_reasons_counters_hw_power_brake>
    </clocks_event_reasons_counters>
    <sparse_operation_mode>Disabled</sparse_operation_mode>
    <fb_memory_usage>
        <total>{fb_total} MiB</total>
        <reserved>{fb_reserved} MiB</reserved>
        <used>{fb_used} MiB</used>
        <free>{fb_free} MiB</free>
    </fb_memory_usage>
    <bar1_memory_usage>
        <total>131072 MiB</total>
        <used>1 MiB</used>
        <free>131071 MiB</free>
    </bar1_memory_usage>
    <cc_protected_memory_usage>
        <total>0 MiB</total>
        <used>0 MiB</used>
        <free>0 MiB</free>
    </cc_protected_memory_usage>
    <compute_mode>Default</compute_mode>
    <utilization>
        <gpu_util>0 %</gpu_util>
        <memory_util>0 %</memory_util>
        <encoder_util>0 %</encoder_util>
        <decoder_util>0 %</decoder_util>
        <jpeg_util>0 %</jpeg_util>
        <ofa_util>0 %</ofa_util>
    </utilization>
    <encoder_stats>
        <session_count>0</session_count>
        <average_fps>0</average_fps>
        <average_latency>0</average_latency>
    </encoder_stats>
    <fbc_stats>
        <session_count>0</session_count>
        <average_fps>0</average_fps>
        <average_latency>0</average_latency>
    </fbc_stats>
    <dram_encryption_mode>
        <current_dram_encryption>N/A</current_dram_encryption>
        <pending_dram_encryption>N/A</pending_dram_encryption>
    </dram_encryption_mode>
    <ecc_mode>
        <current_ecc>Enabled</current_ecc>
        <pending_ecc>Enabled</pending_ecc>
    </ecc_mode>
    <ecc_errors>
        <volatile>
            <sram_correctable>0</sram_correctable>
            <sram_uncorrectable_parity>0</sram_uncorrectable_parity>
            <sram_uncorrectable_secded>0</sram_uncorrectable_secded>
            <dram_correctable>0</dram_correctable>
            <dram_uncorrectable>{ecc_vol_dram_unc}</dram_uncorrectable>
        </volatile>
        <aggregate>
            <sram_correctable>0</sram_correctable>
            <sram_uncorrectable_parity>0</sram_uncorrectable_parity>
            <sram_uncorrectable_secded>0</sram_uncorrectable_secded>
            <dram_correctable>0</dram_correctable>
            <dram_uncorrectable>{ecc_agg_dram_unc}</dram_uncorrectable>
            <sram_threshold_exceeded>No</sram_threshold_exceeded>
        </aggregate>
        <aggregate_uncorrectable_sram_sources>
            <sram_l2>0</sram_l2>
            <sram_sm>0</sram_sm>
            <sram_microcontroller>0</sram_microcontroller>
            <sram_pcie>0</sram_pcie>
            <sram_other>0</sram_other>
        </aggregate_uncorrectable_sram_sources>
        <channel_repair_pending>No</channel_repair_pending>
        <tpc_repair_pending>No</tpc_repair_pending>
        <unrepairable_memory>N/A</unrepairable_memory>
    </ecc_errors>
    <retired_pages>
        <multiple_single_bit_retirement>
            <retired_count>N/A</retired_count>
            <retired_pagelist>N/A</retired_pagelist>
        </multiple_single_bit_retirement>
        <double_bit_retirement>
            <retired_count>N/A</retired_count>
            <retired_pagelist>N/A</retired_pagelist>
        </double_bit_retirement>
        <pending_blacklist>N/A</pending_blacklist>
        <pending_retirement>N/A</pending_retirement>
    </retired_pages>
    <remapped_rows>
        <remapped_row_corr>0</remapped_row_corr>
        <remapped_row_unc>{remap_unc}</remapped_row_unc>
        <remapped_row_pending>{remap_pending}</remapped_row_pending>
        <remapped_row_failure>No</remapped_row_failure>
        <row_remapper_histogram>
            <row_remapper_histogram_max>{hist_max} bank(s)</row_remapper_histogram_max>
            <row_remapper_histogram_high>{hist_high} bank(s)</row_remapper_histogram_high>
            <row_remapper_histogram_partial>0 bank(s)</row_remapper_histogram_partial>
            <row_remapper_histogram_low>0 bank(s)</row_remapper_histogram_low>
            <row_remapper_histogram_none>0 bank(s)</row_remapper_histogram_none>
        </row_remapper_histogram>
    </remapped_rows>
    <temperature>
        <gpu_temp>{temp} C</gpu_temp>
        <gpu_temp_tlimit>57 C</gpu_temp_tlimit>
        <gpu_temp_max_tlimit_threshold>-8 C</gpu_temp_max_tlimit_threshold>
        <gpu_temp_slow_tlimit_threshold>-2 C</gpu_temp_slow_tlimit_threshold>
        <gpu_temp_max_gpu_tlimit_threshold>0 C</gpu_temp_max_gpu_tlimit_threshold>
        <gpu_target_temperature>N/A</gpu_target_temperature>
        <memory_temp>{mem_temp} C</memory_temp>
        <gpu_temp_max_mem_tlimit_threshold>0 C</gpu_temp_max_mem_tlimit_threshold>
    </temperature>
    <supported_gpu_target_temp>
        <gpu_target_temp_min>N/A</gpu_target_temp_min>
        <gpu_target_temp_max>N/A</gpu_target_temp_max>
    </supported_gpu_target_temp>
    <gpu_power_readings>
        <power_state>{pstate}</power_state>
        <average_power_draw>{power_draw} W</average_power_draw>
        <instant_power_draw>{power_draw} W</instant_power_draw>
        <current_power_limit>{power_limit} W</current_power_limit>
        <requested_power_limit>{power_limit} W</requested_power_limit>
        <default_power_limit>{power_limit} W</default_power_limit>
        <min_power_limit>{power_min} W</min_power_limit>
        <max_power_limit>{power_limit} W</max_power_limit>
    </gpu_power_readings>
    <gpu_memory_power_readings>
        <average_power_draw>69.61 W</average_power_draw>
        <instant_power_draw>69.61 W</instant_power_draw>
    </gpu_memory_power_readings>
    <module_power_readings>
        <power_state>{pstate}</power_state>
        <average_power_draw>N/A</average_power_draw>
        <instant_power_draw>N/A</instant_power_draw>
        <current_power_limit>N/A</current_power_limit>
        <requested_power_limit>N/A</requested_power_limit>
        <default_power_limit>N/A</default_power_limit>
        <min_power_limit>N/A</min_power_limit>
        <max_power_limit>N/A</max_power_limit>
    </module_power_readings>
    <power_smoothing>N/A</power_smoothing>
    <power_profiles>
        <power_profile_requested_profiles>N/A</power_profile_requested_profiles>
        <power_profile_enforced_profiles>N/A</power_profile_enforced_profiles>
    </power_profiles>
    <edpp_multiplier>N/A</edpp_multiplier>
    <clocks>
        <graphics_clock>{clk_gr} MHz</graphics_clock>
        <sm_clock>{clk_gr} MHz</sm_clock>
        <mem_clock>{clk_mem} MHz</mem_clock>
        <video_clock>765 MHz</video_clock>
    </clocks>
    <applications_clocks>
        <graphics_clock>{max_gr} MHz</graphics_clock>
        <mem_clock>{clk_mem} MHz</mem_clock>
    </applications_clocks>
    <default_applications_clocks>
        <graphics_clock>{max_gr} MHz</graphics_clock>
        <mem_clock>{clk_mem} MHz</mem_clock>
    </default_applications_clocks>
    <deferred_clocks>
        <mem_clock>N/A</mem_clock>
    </deferred_clocks>
    <max_clocks>
        <graphics_clock>{max_gr} MHz</graphics_clock>
        <sm_clock>{max_gr} MHz</sm_clock>
        <mem_clock>{clk_mem} MHz</mem_clock>
        <video_clock>{max_video} MHz</video_clock>
    </max_clocks>
    <max_customer_boost_clocks>
        <graphics_clock>{max_gr} MHz</graphics_clock>
    </max_customer_boost_clocks>
    <clock_policy>
        <auto_boost>N/A</auto_boost>
        <auto_boost_default>N/A</auto_boost_default>
    </clock_policy>
    <fabric>
        <state>{fabric_state}</state>
        <status>{fabric_status}</status>
        <cliqueId>{clique}</cliqueId>
        <clusterUuid>{cluster_uuid}</clusterUuid>
        <health>
            <summary>N/A</summary>
            <bandwidth>N/A</bandwidth>
            <route_recovery_in_progress>N/A</route_recovery_in_progress>
            <route_unhealthy>N/A</route_unhealthy>
            <access_timeout_recovery>N/A</access_timeout_recovery>
            <incorrect_configuration>N/A</incorrect_configuration>
        </health>
    </fabric>
    <supported_clocks>
        <supported_mem_clock>
            <value>{clk_mem} MHz</value>
            <supported_graphics_clock>{max_gr} MHz</supported_graphics_clock>
            <supported_graphics_clock>{clk_gr} MHz</supported_graphics_clock>
        </supported_mem_clock>
    </supported_clocks>
    <processes>
    </processes>
    <accounted_processes>
    </accounted_processes>
    <capabilities>
        <egm>disabled</egm>
    </capabilities>
</gpu>
"""  # noqa: E501
# fmt: on


def _tabs(text: str, depth: int) -> str:
    out = []
    for line in text.splitlines():
        body = line.lstrip(" ")
        out.append("\t" * (depth + (len(line) - len(body)) // 4) + body)
    return "\n".join(out) + "\n"


def _v12(template: str) -> str:
    """The 590 template in the 570 layout (see the module's docstring)."""
    out: list[str] = []
    skipping = ""
    for line in template.splitlines(keepends=True):
        body = line.strip()
        if skipping:
            skipping = "" if body == f"</{skipping}>" else skipping
            continue
        tag = body[1:].split(">", 1)[0]
        if tag in _V13_BLOCKS:
            skipping = tag
            continue
        if tag in _V13_ELEMENTS and body.endswith(f"</{tag}>"):
            continue
        if body == "<fabric>":
            out.append(_V12_VOLTAGE)
        out.append(line)
    return "".join(out)


GPU_XML = _tabs(_GPU_TEMPLATE, 1)
GPU_XML_V12 = _tabs(_v12(_GPU_TEMPLATE), 1)


def v12_layout(profile: Profile) -> bool:
    """Whether the profile's driver branch prints the v12 layout (R570 and older)."""
    branch = str(profile["driver_version"]).split(".", 1)[0]
    return branch.isdigit() and int(branch) <= LAST_V12_BRANCH


def query_xml(
    profile: Profile,
    faults: Faults,
    node: str,
    timestamp: str | None = None,
    only: int | None = None,
) -> str:
    """``nvidia-smi -q -x`` (``only``: ``-i INDEX``, that GPU alone)."""
    gpus, stamp = selected_gpus(profile, faults, node, only, timestamp)
    old = v12_layout(profile)
    template = GPU_XML_V12 if old else GPU_XML
    parts = [
        '<?xml version="1.0" ?>\n',
        f"{DOCTYPE_V12 if old else DOCTYPE}\n",
        "<nvidia_smi_log>\n",
        f"\t<timestamp>{escape(stamp)}</timestamp>\n",
        f"\t<driver_version>{escape(str(profile['driver_version']))}</driver_version>\n",
        f"\t<cuda_version>{escape(str(profile['cuda_version']))}</cuda_version>\n",
        f"\t<attached_gpus>{len(gpus)}</attached_gpus>\n",
    ]
    for gpu in gpus:
        values = gpu_values(profile, faults, node, gpu)
        text = {key: escape(str(value)) for key, value in values.items()}
        text["gpu_id"] = quoteattr(gpu.bus_id)
        # the XML prints hex ids without "0x" (pci_bus 81, pci_device_id 233010DE)
        for key in ("pci_bus", "device_id", "subsys_id"):
            text[f"xml_{key}"] = escape(str(values[key]).removeprefix("0x"))
        hot = 1520000 if values["cer_hw"] == "Active" else 0
        text["xml_hw_therm_us"] = str(hot + load.hw_thermal_us(faults, node, gpu))
        parts.append(template.format(**text))
        parts.append("\n")
    parts.append("</nvidia_smi_log>\n")
    return "".join(parts)
