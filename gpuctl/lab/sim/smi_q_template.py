"""The per-GPU block of `nvidia-smi -q`, copied from a real 565-driver H100 capture, with the
labels of the R570 branch the lab installs (570.172.08).

Layout (indentation, the column of the colon, trailing blanks) is verbatim from
tests/fixtures/nvidia-smi/nvsmi-q-full-h100-sxm-8gpu-565.txt; the values that vary are
``str.format`` fields (``{sp}``: a trailing blank) filled by :mod:`gpuctl.lab.sim.nvsmi`.
R570 (tests/fixtures/nvidia-smi/nvsmi-q-full-rtx5090-1gpu-570.txt; the 595 and 610 captures
print them the same) renamed the Platform Info fields (Chassis Serial Number ... GPU Fabric
GUID), ``Gpu`` to ``GPU`` under Utilization, ``Power Draw`` to ``Average``/``Instantaneous Power
Draw``, and added DRAM Encryption Mode, Power Smoothing, Workload Power Profiles and three
Fabric Health fields; those values are N/A, as the XML stand-in prints them.
"""

from __future__ import annotations

# fmt: off
GPU_BLOCK = """\
GPU {bus_id}
    Product Name                          : {name}
    Product Brand                         : NVIDIA
    Product Architecture                  : {arch}
    Display Mode                          : Enabled
    Display Active                        : Disabled
    Persistence Mode                      : Enabled
    Addressing Mode                       : None
    MIG Mode
        Current                           : Disabled
        Pending                           : Disabled
    Accounting Mode                       : Disabled
    Accounting Mode Buffer Size           : 4000
    Driver Model
        Current                           : N/A
        Pending                           : N/A
    Serial Number                         : {serial}
    GPU UUID                              : {uuid}
    Minor Number                          : {minor}
    VBIOS Version                         : {vbios}
    MultiGPU Board                        : No
    Board ID                              : {board_id}
    Board Part Number                     : {board_part}
    GPU Part Number                       : 2330-885-A1
    FRU Part Number                       : N/A
    Platform Info
        Chassis Serial Number             : N/A
        Slot Number                       : N/A
        Tray Index                        : N/A
        Host ID                           : N/A
        Peer Type                         : N/A
        Module Id                         : {module_id}
        GPU Fabric GUID                   : N/A
    Inforom Version
        Image Version                     : {inforom}
        OEM Object                        : 2.1
        ECC Object                        : 7.16
        Power Management Object           : N/A
    Inforom BBX Object Flush
        Latest Timestamp                  : 2024/11/14 06:25:18.433
        Latest Duration                   : 92243 us
    GPU Operation Mode
        Current                           : N/A
        Pending                           : N/A
    GPU C2C Mode                          : Disabled
    GPU Virtualization Mode
        Virtualization Mode               : None
        Host VGPU Mode                    : N/A
        vGPU Heterogeneous Mode           : N/A
    GPU Reset Status
        Reset Required                    : No
        Drain and Reset Recommended       : No
    GPU Recovery Action                   : None
    GSP Firmware Version                  : {gsp_fw}
    IBMNPU
        Relaxed Ordering Mode             : N/A
    PCI
        Bus                               : {pci_bus}
        Device                            : 0x00
        Domain                            : 0x0000
        Base Classcode                    : 0x3
        Sub Classcode                     : 0x2
        Device Id                         : {device_id}
        Bus Id                            : {bus_id}
        Sub System Id                     : {subsys_id}
        GPU Link Info
            PCIe Generation
                Max                       : {gen_max}
                Current                   : {gen_cur}
                Device Current            : {gen_cur}
                Device Max                : {gen_max}
                Host Max                  : {gen_max}
            Link Width
                Max                       : {width_max}x
                Current                   : {width_cur}x
        Bridge Chip
            Type                          : N/A
            Firmware                      : N/A
        Replays Since Reset               : 0
        Replay Number Rollovers           : 0
        Tx Throughput                     : 567 KB/s
        Rx Throughput                     : 559 KB/s
        Atomic Caps Outbound              : {atomic}
        Atomic Caps Inbound               : {atomic}
    Fan Speed                             : N/A
    Performance State                     : {pstate}
    Clocks Event Reasons
        Idle                              : {cer_idle}
        Applications Clocks Setting       : Not Active
        SW Power Cap                      : Not Active
        HW Slowdown                       : {cer_hw}
            HW Thermal Slowdown           : {cer_hw_thermal}
            HW Power Brake Slowdown       : Not Active
        Sync Boost                        : Not Active
        SW Thermal Slowdown               : Not Active
        Display Clock Setting             : Not Active
    Sparse Operation Mode                 : Disabled
    FB Memory Usage
        Total                             : {fb_total} MiB
        Reserved                          : {fb_reserved} MiB
        Used                              : {fb_used} MiB
        Free                              : {fb_free} MiB
    BAR1 Memory Usage
        Total                             : 131072 MiB
        Used                              : 1 MiB
        Free                              : 131071 MiB
    Conf Compute Protected Memory Usage
        Total                             : 0 MiB
        Used                              : 0 MiB
        Free                              : 0 MiB
    Compute Mode                          : Default
    Utilization
        GPU                               : 0 %
        Memory                            : 0 %
        Encoder                           : 0 %
        Decoder                           : 0 %
        JPEG                              : 0 %
        OFA                               : 0 %
    Encoder Stats
        Active Sessions                   : 0
        Average FPS                       : 0
        Average Latency                   : 0
    FBC Stats
        Active Sessions                   : 0
        Average FPS                       : 0
        Average Latency                   : 0
    DRAM Encryption Mode
        Current                           : N/A
        Pending                           : N/A
    ECC Mode
        Current                           : Enabled
        Pending                           : Enabled
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable Parity     : 0
            SRAM Uncorrectable SEC-DED    : 0
            DRAM Correctable              : 0
            DRAM Uncorrectable            : {ecc_vol_dram_unc}
        Aggregate
            SRAM Correctable              : 0
            SRAM Uncorrectable Parity     : 0
            SRAM Uncorrectable SEC-DED    : 0
            DRAM Correctable              : 0
            DRAM Uncorrectable            : {ecc_agg_dram_unc}
            SRAM Threshold Exceeded       : No
        Aggregate Uncorrectable SRAM Sources
            SRAM L2                       : 0
            SRAM SM                       : 0
            SRAM Microcontroller          : 0
            SRAM PCIE                     : 0
            SRAM Other                    : 0
    Retired Pages
        Single Bit ECC                    : N/A
        Double Bit ECC                    : N/A
        Pending Page Blacklist            : N/A
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : {remap_unc}
        Pending                           : {remap_pending}
        Remapping Failure Occurred        : No
        Bank Remap Availability Histogram
            Max                           : {hist_max} bank(s)
            High                          : {hist_high} bank(s)
            Partial                       : 0 bank(s)
            Low                           : 0 bank(s)
            None                          : 0 bank(s)
    Temperature
        GPU Current Temp                  : {temp} C
        GPU T.Limit Temp                  : 57 C
        GPU Shutdown T.Limit Temp         : -8 C
        GPU Slowdown T.Limit Temp         : -2 C
        GPU Max Operating T.Limit Temp    : 0 C
        GPU Target Temperature            : N/A
        Memory Current Temp               : {mem_temp} C
        Memory Max Operating T.Limit Temp : 0 C
    GPU Power Readings
        Average Power Draw                : {power_draw} W
        Instantaneous Power Draw          : {power_draw} W
        Current Power Limit               : {power_limit} W
        Requested Power Limit             : {power_limit} W
        Default Power Limit               : {power_limit} W
        Min Power Limit                   : {power_min} W
        Max Power Limit                   : {power_limit} W
    GPU Memory Power Readings{sp}
        Average Power Draw                : 69.61 W
        Instantaneous Power Draw          : 69.61 W
    Module Power Readings
        Average Power Draw                : N/A
        Instantaneous Power Draw          : N/A
        Current Power Limit               : N/A
        Requested Power Limit             : N/A
        Default Power Limit               : N/A
        Min Power Limit                   : N/A
        Max Power Limit                   : N/A
    Power Smoothing                       : N/A
    Workload Power Profiles
        Requested Profiles                : N/A
        Enforced Profiles                 : N/A
    Clocks
        Graphics                          : {clk_gr} MHz
        SM                                : {clk_gr} MHz
        Memory                            : {clk_mem} MHz
        Video                             : 765 MHz
    Applications Clocks
        Graphics                          : {max_gr} MHz
        Memory                            : {clk_mem} MHz
    Default Applications Clocks
        Graphics                          : {max_gr} MHz
        Memory                            : {clk_mem} MHz
    Deferred Clocks
        Memory                            : N/A
    Max Clocks
        Graphics                          : {max_gr} MHz
        SM                                : {max_gr} MHz
        Memory                            : {clk_mem} MHz
        Video                             : {max_video} MHz
    Max Customer Boost Clocks
        Graphics                          : {max_gr} MHz
    Clock Policy
        Auto Boost                        : N/A
        Auto Boost Default                : N/A
    Voltage
        Graphics                          : 685.000 mV
    Fabric
        State                             : {fabric_state}
        Status                            : {fabric_status}
        CliqueId                          : {clique}
        ClusterUUID                       : {cluster_uuid}
        Health
            Bandwidth                     : N/A
            Route Recovery in progress    : N/A
            Route Unhealthy               : N/A
            Access Timeout Recovery       : N/A
    Processes                             : None
    Capabilities
        EGM                               : disabled
"""
# fmt: on
